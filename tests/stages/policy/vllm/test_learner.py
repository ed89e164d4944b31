"""The learner's processed log-probs: temperature + top-p renormalised, vLLM's nucleus rule."""

from __future__ import annotations

import pytest
import torch

from stages.policy.sampling import sampled_logprobs
from stages.policy.torch_tiny._generate import choose_tokens
from stages.policy.vllm._learner import processed_logprobs


def test_top_p_keeps_the_same_nucleus_as_the_torch_sampler() -> None:
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3  # [B, V]
    logp = processed_logprobs(logits, temperature=0.7, top_p=0.9)  # [B, V]
    kept = torch.isfinite(logp)
    # torch_tiny's inverse-CDF sampler never picks a token outside the nucleus, whatever the uniform.
    for u in torch.linspace(0, 0.999, 40):
        tok = choose_tokens(logits, torch.full((64,), float(u)), torch.zeros(64, dtype=torch.bool), temperature=0.7, top_p=0.9)
        assert bool(kept.gather(1, tok[:, None]).all())
    assert torch.allclose(logp.exp().sum(-1), torch.ones(64), atol=1e-5)  # renormalised
    assert bool(kept.sum(-1).lt(50).any())  # something was cut


def test_kept_tokens_keep_their_relative_probabilities() -> None:
    logits = torch.tensor([[4.0, 3.0, 0.0, -5.0]])
    logp = processed_logprobs(logits, temperature=1.0, top_p=0.9)
    p = torch.softmax(logits, -1)[0]
    assert torch.isinf(logp[0, 2:]).all()  # the tail below 1 - top_p is removed
    assert torch.allclose(logp[0, :2].exp(), p[:2] / p[:2].sum())


def test_top_p_one_is_the_tempered_softmax_and_greedy_is_temperature_one() -> None:
    logits = torch.randn(3, 9)
    assert torch.allclose(processed_logprobs(logits, temperature=0.5, top_p=1.0), (logits / 0.5).log_softmax(-1))
    assert torch.allclose(processed_logprobs(logits, temperature=0.0, top_p=0.5), logits.log_softmax(-1))


def test_the_most_likely_token_always_survives() -> None:
    logits = torch.tensor([[10.0, 0.0, 0.0]])
    logp = processed_logprobs(logits, temperature=1.0, top_p=1e-6)
    assert logp[0, 0] == pytest.approx(0.0) and torch.isinf(logp[0, 1:]).all()


def test_completion_logprobs_of_a_transformers_model_are_finite_and_masked() -> None:
    transformers = pytest.importorskip("transformers", reason="the transformers learner needs the vllm environment")
    from stages.policy.vllm._learner import CausalLMTrainable

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    model = CausalLMTrainable(transformers.LlamaForCausalLM(cfg), temperature=0.7, top_p=0.5)
    logp, mask, entropy = model.completion_logprobs([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]])  # [2, 3]
    assert mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert bool(torch.isfinite(logp).all()) and logp[0, 2] == 0 and entropy[0, 2] == 0
    assert bool((entropy[mask.bool()] >= 0).all())
    logp.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # the same completion alone gives the same numbers (right padding does not leak)
    alone = model.completion_logprobs([[1, 2, 3]], [[5, 6]]).logprobs
    assert torch.allclose(alone[0, :2], logp[0, :2], atol=1e-5)


def test_vllm_rule_and_the_shared_rule_agree_on_every_kept_token() -> None:
    torch.manual_seed(1)
    logits = torch.randn(32, 40) * 2  # [B, V]
    vllm = processed_logprobs(logits, temperature=0.7, top_p=0.9)  # [B, V]
    tokens = torch.arange(40).expand(32, 40)  # [B, V] every token scored
    shared = sampled_logprobs(logits[:, None, :].expand(-1, 40, -1), tokens, temperature=0.7, top_p=0.9)  # [B, V]
    kept = torch.isfinite(vllm)
    assert torch.allclose(shared[kept], vllm[kept], atol=1e-5)
    assert bool(torch.isfinite(shared).all())  # a token outside the nucleus is scored, not -inf
