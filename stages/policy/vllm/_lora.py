"""LoRA for the vLLM backend (`policy.options.lora_rank` > 0): peft on the learner, vLLM adapters in the engine.

The learner wraps the `transformers` model with a peft LoRA (`apply_lora`) and trains the adapter only; the
state it publishes is the adapter's (`get_peft_model_state_dict`: `base_model.model.<module>.lora_A.weight`
...). `VllmPolicy.load_weights` writes each version as a peft adapter directory (`write_adapter`) and
registers it with the engine as `LoRARequest("rollcut-v<version>", version, dir)` (`AsyncLLM.add_lora`);
every request submitted afterwards carries that request, so it is served by that adapter and stamped with
that version. Version 0 is the base model (peft initialises B = 0, so a fresh adapter is the identity).

This module imports peft lazily: without it, asking for LoRA is a clear error naming the install route.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's allowed `max_lora_rank` values (`vllm.config.lora.MaxLoRARanks`); an adapter may be smaller."""

PEFT_HINT = "policy.options.lora_rank needs peft: pip install -e '.[lora]' (in .venv-vllm: uv pip install peft)"


@dataclass(frozen=True, slots=True)
class LoraSettings:
    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def engine_max_rank(self) -> int:
        """The smallest `max_lora_rank` vLLM accepts that holds this adapter."""
        return next(r for r in VLLM_LORA_RANKS if r >= self.rank)

    def peft_config(self, base_model: str = "") -> Any:
        try:
            from peft import LoraConfig
        except ImportError:
            raise RuntimeError(PEFT_HINT) from None
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            target_modules=list(self.target_modules),
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=base_model or None,
        )


def lora_problems(rank: int, alpha: float, target_modules: Sequence[str]) -> list[str]:
    problems = []
    if rank < 0 or rank > VLLM_LORA_RANKS[-1]:
        problems.append(f"policy.options.lora_rank: {rank} is not in 0..{VLLM_LORA_RANKS[-1]} (0 = full fine-tune)")
    if rank > 0 and alpha <= 0:
        problems.append(f"policy.options.lora_alpha: {alpha} must be > 0")
    if rank > 0 and not target_modules:
        problems.append("policy.options.lora_target_modules: name at least one module (e.g. q_proj)")
    return problems


def apply_lora(lm: Any, lora: LoraSettings, *, seed: int = 0) -> Any:
    """`lm` wrapped by peft with a fresh adapter (seeded A, zero B): only the adapter requires grad."""
    from peft import get_peft_model

    torch.manual_seed(seed)
    with warnings.catch_warnings():  # peft reads transformers' deprecated `is_gradient_checkpointing`: not the user's to fix
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(lm, lora.peft_config())


def adapter_state(peft_lm: Any) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return dict(get_peft_model_state_dict(peft_lm))


def load_adapter_state(peft_lm: Any, state: Mapping[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_lm, dict(state))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"adapter state has keys this LoRA does not ({unexpected[:5]})")


def write_adapter(directory: Path, lora: LoraSettings, base_model: str, state: Mapping[str, torch.Tensor]) -> Path:
    """A peft adapter directory (adapter_config.json + adapter_model.safetensors) vLLM's LoRA loader reads."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = lora.peft_config(base_model).to_dict()
    config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
    (directory / "adapter_config.json").write_text(json.dumps(config, default=str))
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(directory / "adapter_model.safetensors"))
    return directory


def check_adapter_state(state: Mapping[str, Any], version: int) -> None:
    if not state or not all(".lora_" in k for k in state):
        odd = [k for k in state if ".lora_" not in k][:5]
        raise ValueError(f"weights for version {version} are not a LoRA adapter state (keys {odd or 'none'})")
