from __future__ import annotations

import pytest
import torch

from stages.policy.torch_tiny import TinyLM
from stages.policy.torch_tiny._model import KVCache

from .conftest import tiny_model


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    P = max(map(len, rows))
    ids = torch.full((len(rows), P), pad)
    for i, r in enumerate(rows):
        ids[i, P - len(r) :] = torch.tensor(r)
    mask = torch.arange(P)[None] >= torch.tensor([P - len(r) for r in rows])[:, None]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


@torch.inference_mode()
def test_cached_decoding_matches_full_recompute(model: TinyLM) -> None:
    torch.manual_seed(1)
    rows = [torch.randint(10, model.cfg.vocab_size, (n,)).tolist() for n in (7, 12, 3)]
    extra = torch.randint(10, model.cfg.vocab_size, (3, 5))  # [B, 5] tokens appended one by one
    ids, mask, pos = _left_pad(rows, model.cfg.pad_id)
    P = ids.shape[1]
    cache = KVCache.empty(model.cfg, 3, P + 5)
    key_mask = torch.cat([mask, torch.ones(3, 5, dtype=torch.bool)], dim=1)  # [B, P + 5]
    cached = [model.logits(model.hidden(ids, pos, key_mask[:, :P], cache, start=0)[:, -1])]
    next_pos = mask.sum(-1)
    for t in range(5):
        h = model.hidden(
            extra[:, t : t + 1], next_pos[:, None] + t, key_mask[:, : P + t + 1], cache, start=P + t
        )
        cached.append(model.logits(h[:, -1]))
    for i, row in enumerate(rows):  # each row alone, unpadded, recomputed from scratch
        full = model(torch.tensor([row + extra[i].tolist()]))[0]  # [T, V]
        expected = full[len(row) - 1 :]  # logits after the prompt and after each appended token
        got = torch.stack([c[i] for c in cached])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_completion_logprobs_shapes_mask_and_values(model: TinyLM) -> None:
    prompts = [[1, 11, 12, 13], [1, 14]]
    completions = [[15, 2], [16, 17, 18, 2]]
    logp, mask, _ = model.completion_logprobs(prompts, completions)
    assert logp.shape == mask.shape == (2, 4)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert logp[0, 2:].eq(0).all()
    with torch.no_grad():  # row 1 by hand: log-softmax of the full forward at each predicting position
        seq = torch.tensor([prompts[1] + completions[1]])
        ref = torch.log_softmax(model(seq)[0], -1)  # [L, V]
        expected = torch.stack([ref[len(prompts[1]) - 1 + t, c] for t, c in enumerate(completions[1])])
    torch.testing.assert_close(logp[1].detach(), expected, atol=1e-5, rtol=1e-4)


def test_completion_logprobs_has_gradients(model: TinyLM) -> None:
    logp, mask, _ = model.completion_logprobs([[1, 11]], [[12, 2]])
    (logp * mask).sum().backward()
    assert model.tok_emb.weight.grad is not None
    assert model.tok_emb.weight.grad.abs().sum() > 0


def test_default_size_is_about_a_million_parameters() -> None:
    from stages.policy.torch_tiny import ModelConfig

    n = TinyLM(ModelConfig(vocab_size=400, pad_id=0)).num_parameters()
    assert 0.8e6 < n < 1.2e6


def test_heads_must_divide_d_model(tokenizer) -> None:
    from stages.policy.torch_tiny import ModelConfig

    with pytest.raises(ValueError, match="multiple of heads"):
        TinyLM(ModelConfig(vocab_size=len(tokenizer), pad_id=0, d_model=30, heads=4))


def test_models_with_the_same_seed_are_equal(tokenizer) -> None:
    a, b = tiny_model(tokenizer, seed=3), tiny_model(tokenizer, seed=3)
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
