"""A LoRA adapter merged into the served weights: W = W0 + (alpha / r) B A, always from the base W0.

The learner trains a peft adapter (`stages/policy/vllm/_lora.py`) and publishes its state
(`base_model.model.<module>.lora_A.weight` / `lora_B.weight`); the hf policy serves each version as plain
weights with that adapter merged in, so decoding runs the base model's matmuls only. Each version is
merged from the base weights kept at start, never from the previous version's merge, so no rounding
accumulates over versions.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

PEFT_PREFIX = "base_model.model."


def base_names(adapter: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, str]]:
    """Model weight name -> (its lora_A key, its lora_B key) of every module the adapter changes. Pure.

    Raises:
        ValueError: an A without its B (or the reverse), or a key that is not a LoRA key.
    """
    out: dict[str, tuple[str, str]] = {}
    for key in adapter:
        if ".lora_A." not in key and ".lora_B." not in key:
            raise ValueError(f"{key!r} is not a LoRA adapter key")
        a_key = key.replace(".lora_B.", ".lora_A.")
        b_key = a_key.replace(".lora_A.", ".lora_B.")
        if a_key not in adapter or b_key not in adapter:
            raise ValueError(f"adapter key {key!r} has no lora_A / lora_B partner")
        module = a_key.split(".lora_A.")[0].removeprefix(PEFT_PREFIX)
        out[f"{module}.weight"] = (a_key, b_key)
    return out


@torch.no_grad()
def merged_weights(
    base: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor], *, scale: float
) -> dict[str, torch.Tensor]:
    """The weights `adapter` changes, merged: base[name] + scale * B @ A (new tensors, `base` untouched).

    Raises:
        ValueError: a module the base does not have, or an adapter whose shapes do not fit it.
    """
    merged = {}
    for name, (a_key, b_key) in base_names(adapter).items():
        if name not in base:
            raise ValueError(f"the adapter changes {name!r}, which the served model does not have")
        w, a, b = base[name], adapter[a_key], adapter[b_key]
        if b.shape[0] != w.shape[0] or a.shape[1] != w.shape[1] or a.shape[0] != b.shape[1]:
            raise ValueError(f"adapter for {name!r}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit {tuple(w.shape)}")
        merged[name] = w + scale * (b.to(w) @ a.to(w))
    return merged
