"""Tensors on the wire without pickle: the one form in which weights and trainer state cross a socket.

`pack(tree)` encodes a tree of dicts (str or int keys), lists, tuples, None, bools, ints, floats, strings,
bytes and CPU tensors as msgspec msgpack; each tensor is a msgpack extension holding its dtype name, its
shape and its raw bytes, each tuple an extension holding its items (so `random.getstate()` and an
optimizer's `betas` come back as tuples). `unpack(blob)` rebuilds exactly that tree and nothing else: no
class is looked up by name, no code runs, so a forged frame can at worst fail to decode (`WireError`).
Anything else in a tree is refused when it is packed (`TypeError`), on the sender's side.

Used for `LearnerUpdated` (the learner process's weights and `Trainer.state_dict()`) and `LoadWeights`
(a decoding worker's weights); `torch.load` never reads bytes that came from a socket (issue 34).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec
import torch

_TENSOR, _TUPLE = 1, 2
"""msgpack extension codes."""
DTYPES: Mapping[str, torch.dtype] = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
                  torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
}
"""The dtypes a tree may hold, by name."""
_ENCODER = msgspec.msgpack.Encoder()
_TensorFields = tuple[str, list[int], bytearray]


class WireError(ValueError):
    """Bytes that are not a packed tree (garbage, a pickle, a tensor whose bytes do not match its shape)."""


def pack(tree: Any) -> bytes:
    """The tree as bytes (`unpack` gives it back). Raises TypeError for a value it cannot carry."""
    return _ENCODER.encode(_lower(tree))


def unpack(blob: bytes | memoryview) -> Any:
    """The tree `pack` encoded. Raises WireError for anything else."""
    try:
        return msgspec.msgpack.decode(blob, ext_hook=_ext_hook)
    except (msgspec.DecodeError, ValueError, TypeError, RuntimeError) as exc:  # RecursionError: too deep
        raise WireError(f"not a packed tensor tree ({len(blob)} bytes): {exc}") from exc


def unpack_weights(blob: bytes | memoryview) -> dict[str, torch.Tensor]:
    """A packed state dict (parameter name -> tensor). Raises WireError for anything else."""
    tree = unpack(blob)
    if not isinstance(tree, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tree.items()):
        raise WireError("not a state dict of tensors")
    return tree


def _lower(value: Any) -> Any:
    """`value` in msgpack's own types (tensors and tuples as extensions)."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, torch.Tensor):
        return msgspec.msgpack.Ext(_TENSOR, _ENCODER.encode(_tensor_fields(value)))
    if isinstance(value, tuple):
        return msgspec.msgpack.Ext(_TUPLE, _ENCODER.encode([_lower(v) for v in value]))
    if isinstance(value, list):
        return [_lower(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str | int) and not isinstance(k, bool) for k in value):
            raise TypeError("a packed dict's keys are strings or ints")
        return {k: _lower(v) for k, v in value.items()}
    raise TypeError(f"cannot pack a {type(value).__name__} (tensors, numbers, strings, bytes, lists, tuples, dicts)")


def _tensor_fields(tensor: torch.Tensor) -> tuple[str, list[int], bytes]:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise TypeError(f"cannot pack a tensor of dtype {name}")
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return name, list(tensor.shape), flat.view(torch.uint8).numpy().tobytes()


def _ext_hook(code: int, data: memoryview) -> Any:
    """msgspec's ext_hook: rebuild a tensor or a tuple; any other extension is refused."""
    if code == _TUPLE:
        return tuple(msgspec.msgpack.decode(data, ext_hook=_ext_hook, type=list))
    if code != _TENSOR:
        raise WireError(f"unknown extension {code}")
    name, shape, raw = msgspec.msgpack.decode(data, type=_TensorFields)
    dtype = DTYPES.get(name)
    if dtype is None or any(n < 0 for n in shape):
        raise WireError(f"bad tensor header: dtype {name!r}, shape {shape}")
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise WireError(f"a {name} tensor of shape {shape} cannot hold {len(raw)} bytes")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=dtype).reshape(shape)  # shares (and keeps alive) the decoded buffer
