"""Worker extension loaded into every vLLM worker (`worker_extension_cls`): weight loading by version.

`AsyncLLM.collective_rpc("rollcut_load_weights", args=(version, [(name, dtype, shape, bytes), ...]))` runs
`rollcut_load_weights` on each worker between engine steps. Tensors travel as raw bytes (msgpack `bin`,
which vLLM's utility channel carries as is; a tensor object in untyped utility arguments would arrive as a
plain list). Names are the Hugging Face checkpoint's, which the model's `load_weights` maps onto vLLM's
fused layers (qkv_proj, gate_up_proj).

This module must import without Trio or the rest of rollcut's runtime: it runs in the engine process.
"""

from __future__ import annotations

import torch

WireTensor = tuple[str, str, list[int], bytes]
"""(name, torch dtype name, shape, raw little-endian bytes)."""


def to_wire(name: str, tensor: torch.Tensor) -> WireTensor:
    t = tensor.detach().to("cpu").contiguous()
    return name, str(t.dtype).removeprefix("torch."), list(t.shape), t.view(torch.uint8).numpy().tobytes()


def from_wire(item: WireTensor) -> tuple[str, torch.Tensor]:
    name, dtype, shape, data = item
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return name, flat.view(getattr(torch, dtype)).reshape(shape)


class RollcutWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker (it has `model_runner`)."""

    rollcut_version: int = 0

    def rollcut_load_weights(self, version: int, weights: list[WireTensor]) -> int:
        # The worker's in-place reload (checkpoint names -> fused, processed parameters); a bare
        # `model.load_weights` only works before the engine post-processes its parameters.
        self.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=(from_wire(item) for item in weights), is_checkpoint_format=True
        )
        self.rollcut_version = version
        return version

    def rollcut_weight_version(self) -> int:
        return self.rollcut_version
