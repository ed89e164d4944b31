"""Start vLLM's `AsyncLLM` for a model directory on a fresh asyncio loop thread (imports vLLM)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ._loop import LoopThread
from ._prompt import ChatPrompt
from ._server import VllmPolicy
from ._vllm_api import TOP_P, Sampling

if TYPE_CHECKING:
    from pipeline.config import PolicySection

    from . import VllmOptions

log = structlog.get_logger(__name__)

WORKER_EXTENSION = "stages.policy.vllm._worker.RollcutWorkerExtension"


def checkpoint_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every `*.safetensors` file in `model_dir` (headers only, nothing loaded)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    if not shapes:
        raise ValueError(f"{model_dir}: no *.safetensors weights (save the model with safe_serialization=True)")
    return shapes


def checkpoint_dtype(model_dir: str) -> str:
    """The dtype in the checkpoint's config.json ("auto" if none): vLLM's own "auto" turns float32 into
    bfloat16 on CPU, which would make the engine's log-probs differ from the float32 learner's."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    dtype = config.get("dtype") or config.get("torch_dtype")
    return str(dtype) if dtype else "auto"


def engine_args(cfg: PolicySection, opts: VllmOptions, *, seed: int) -> Any:
    from vllm import AsyncEngineArgs

    fields: dict[str, Any] = {
        "model": cfg.model,
        "tokenizer": cfg.model,
        "dtype": checkpoint_dtype(cfg.model) if opts.dtype == "auto" else opts.dtype,
        "max_model_len": opts.max_model_len,
        "max_num_seqs": cfg.max_batch,
        "enforce_eager": opts.enforce_eager,
        "gpu_memory_utilization": opts.gpu_memory_utilization,
        "seed": seed,
        # The log-prob of the sampled token under the distribution it was sampled from (temperature,
        # top-p renormalised): what the learner's completion_logprobs computes (_learner.py).
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": WORKER_EXTENSION,
        # Weights change every update; a prefix cache built by older weights would be reused silently.
        "enable_prefix_caching": False,
        "disable_log_stats": True,
    }
    lora = opts.lora
    if lora is not None:  # adapters by version: the current one and the one before may share a batch
        fields |= {"enable_lora": True, "max_lora_rank": lora.engine_max_rank, "max_loras": 2, "max_cpu_loras": 4}
    fields.update(opts.engine_args)
    return AsyncEngineArgs(**fields)


def sampling_of(cfg: PolicySection, opts: VllmOptions) -> Sampling:
    """How the engine samples: the section's temperature and token budget, and no nucleus (`TOP_P`): a
    `policy.top_p` below 1 is not applied on this backend (said once, in the log)."""
    if cfg.top_p < TOP_P:
        log.warning("policy.vllm.top_p_not_applied", top_p=cfg.top_p,
                    note="the vllm backend samples without a nucleus (the engine records none): docs/vllm.md, Log-probs")
    return Sampling(temperature=cfg.temperature, top_p=TOP_P, max_new_tokens=cfg.max_new_tokens,
                    fuzzy_cutoff=opts.fuzzy_cutoff, seeded=opts.seeded)


def start_engine(cfg: PolicySection, opts: VllmOptions, *, seed: int) -> VllmPolicy:
    """Build the prompt format, start the engine (tens of seconds on CPU) and wrap it in a `VllmPolicy`."""
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory; never the hub
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(opts.kv_cache_gib))
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    prompt = ChatPrompt(
        tokenizer,
        history=opts.history,
        show_admissible=opts.show_admissible,
        max_obs_words=opts.max_obs_words,
        max_prompt_tokens=opts.max_prompt_tokens,
        instruction=opts.instruction,
    )
    sampling = sampling_of(cfg, opts)
    shapes = checkpoint_shapes(cfg.model)
    args = engine_args(cfg, opts, seed=seed)
    loop = LoopThread("rollcut-vllm")
    started = time.perf_counter()
    try:
        engine = loop.run(_create(args))
    except BaseException:
        loop.close()
        raise
    log.info("policy.vllm.started", model=cfg.model, seconds=round(time.perf_counter() - started, 1))
    return VllmPolicy(loop, engine, prompt, sampling, model_path=cfg.model, shapes=shapes, seed=seed, lora=opts.lora)


async def _create(args: Any) -> Any:
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(args)
