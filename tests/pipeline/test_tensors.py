"""Tensors on the wire without pickle: a trainer's whole state survives `pack` / `unpack` exactly, and
bytes that are anything else (a pickle, garbage, a tensor whose bytes do not fit its shape) raise WireError."""

import io
import pickle
import random

import msgspec
import pytest
import torch

from pipeline import tensors


def _trainer_like_state():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "rng": random.Random(7).getstate(),
        "average": None,
        "reference": {"h": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "mask": torch.tensor([True, False]),
                      "empty": torch.empty(0, 4, dtype=torch.int64), "scalar": torch.tensor(2.5, dtype=torch.float64)},
    }


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_a_trainer_state_comes_back_exactly_with_its_tuples_and_int_keys():
    state = _trainer_like_state()
    back = tensors.unpack(tensors.pack(state))
    assert _same(state, back)
    rng = random.Random()
    rng.setstate(back["rng"])  # a tuple again: random refuses a list
    assert rng.random() == random.Random(7).random()
    optimizer = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters())
    optimizer.load_state_dict(back["optimizer"])
    assert _same(optimizer.state_dict()["state"], state["optimizer"]["state"])


def test_what_it_cannot_carry_is_refused_when_packed():
    for value in ({"x": object()}, {"x": {1.5: 1}}, [torch.zeros(2, dtype=torch.uint16)], {True: 1}):
        with pytest.raises(TypeError):
            tensors.pack(value)


class _Opens:
    def __reduce__(self):
        return (open, ("/nonexistent/never", "w"))


def test_pickles_and_malformed_trees_raise_wire_error():
    saved = io.BytesIO()
    torch.save({"w": torch.ones(2)}, saved)
    ext = msgspec.msgpack.Ext
    enc = msgspec.msgpack.encode
    bad = [
        b"", b"\xc1", pickle.dumps(_Opens()), saved.getvalue(),
        enc(ext(9, b"")),  # an unknown extension
        enc(ext(1, enc(("float32", [2], b"\x00" * 7)))),  # bytes that do not fit the shape
        enc(ext(1, enc(("object", [1], b"\x00")))),  # a dtype that is not listed
        enc(ext(1, enc(("float32", [-1], b"")))),
        enc(ext(1, enc(["float32", "2", b"\x00" * 8]))),  # a malformed header
        tensors.pack({"w": torch.ones(2)})[:-1],  # truncated
    ]
    for blob in bad:
        with pytest.raises(tensors.WireError):
            tensors.unpack(blob)


def test_weights_must_be_a_state_dict_of_tensors():
    assert torch.equal(tensors.unpack_weights(tensors.pack({"w": torch.ones(2)}))["w"], torch.ones(2))
    for tree in ([torch.ones(1)], {"w": 1.0}, {1: torch.ones(1)}):
        with pytest.raises(tensors.WireError):
            tensors.unpack_weights(tensors.pack(tree))
