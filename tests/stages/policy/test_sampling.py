"""The one sampling distribution (`stages.policy.sampling`): a nucleus recorded at sampling makes a token's
log-prob continuous in the logits, so a last-bit difference between two batches cannot move it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from stages.policy.sampling import nucleus_mask, nucleus_sizes, sampled_logprobs, sampling_entropy

T = 0.7
PROBS = [0.5, 0.3, 0.15, 0.05]


def _boundary() -> tuple[torch.Tensor, torch.Tensor, float]:
    """Two logits rows a float-rounding apart (as one batch's forward and another's give) and a top_p that
    sits between their masses before token 2: the top-p rule keeps token 2 for one row and not the other."""
    a = torch.log(torch.tensor(PROBS)) * T  # [V]
    b = a + torch.tensor([2e-6, 0.0, 0.0, 0.0])  # [V]
    before = [float(_mass_before(x)[2]) for x in (a, b)]
    assert before[0] != before[1]  # the rounding-sized change reaches the mass in float32
    return a, b, max(before)


def _mass_before(logits: torch.Tensor) -> torch.Tensor:
    """[V] mass of the tokens more likely than each rank, computed as the top-p rule computes it."""
    p = F.log_softmax(logits / T, dim=-1).exp().sort(descending=True).values  # [V]
    return p.cumsum(dim=-1) - p


def test_the_top_p_rule_jumps_on_a_rounding_sized_change_but_a_recorded_nucleus_does_not() -> None:
    a, b, top_p = _boundary()
    token = torch.tensor(0)
    by_rule = [float(sampled_logprobs(x, token, temperature=T, top_p=top_p)) for x in (a, b)]
    assert abs(by_rule[0] - by_rule[1]) > 0.1  # the defect: token 2 (mass 0.15) in for one row, out for the other
    recorded = nucleus_sizes(a, temperature=T, top_p=top_p)  # what sampling on row a records
    scored = [float(sampled_logprobs(x, token, temperature=T, top_p=top_p, nucleus=recorded)) for x in (a, b)]
    assert abs(scored[0] - scored[1]) < 1e-5
    assert scored[0] == by_rule[0]  # at the logits that sampled, the recorded nucleus is the rule's
    entropies = [float(sampling_entropy(x, temperature=T, top_p=top_p, nucleus=recorded)) for x in (a, b)]
    assert abs(entropies[0] - entropies[1]) < 1e-5


def test_nucleus_sizes_count_what_the_top_p_rule_keeps() -> None:
    logits = torch.randn(5, 7, 30, generator=torch.Generator().manual_seed(0)) * 3  # [B, T, V]
    for top_p in (0.3, 0.9, 0.95):
        sizes = nucleus_sizes(logits, temperature=T, top_p=top_p)  # [B, T]
        rule = nucleus_mask(F.log_softmax(logits / T, dim=-1), top_p)  # [B, T, V]
        assert torch.equal(sizes, rule.sum(dim=-1))
        assert torch.equal(nucleus_mask(F.log_softmax(logits / T, dim=-1), top_p, sizes), rule)
    assert nucleus_sizes(logits, temperature=T, top_p=1.0).eq(30).all()
    assert nucleus_sizes(logits, temperature=0.0, top_p=0.5).eq(30).all()  # greedy: no nucleus


def test_a_size_of_zero_falls_back_to_the_top_p_rule_per_position() -> None:
    logits = torch.randn(2, 3, 30, generator=torch.Generator().manual_seed(1)) * 3  # [B, T, V]
    tokens = logits.argmax(dim=-1)  # [B, T]
    sizes = torch.tensor([[2, 0, 5], [0, 0, 0]])  # [B, T]
    mixed = sampled_logprobs(logits, tokens, temperature=T, top_p=0.9, nucleus=sizes)
    rule = sampled_logprobs(logits, tokens, temperature=T, top_p=0.9)
    top = F.log_softmax(logits / T, dim=-1).topk(5, dim=-1).values  # [B, T, 5] descending
    torch.testing.assert_close(mixed[0, 0], top[0, 0, 0] - top[0, 0, :2].logsumexp(-1))
    torch.testing.assert_close(mixed[0, 2], top[0, 2, 0] - top[0, 2, :5].logsumexp(-1))
    torch.testing.assert_close(mixed[0, 1], rule[0, 1])
    torch.testing.assert_close(mixed[1], rule[1])


def test_a_recorded_nucleus_is_widened_to_a_token_that_left_it() -> None:
    logits = torch.log(torch.tensor(PROBS)) * T
    one = torch.tensor(1)
    logp = sampled_logprobs(logits, torch.tensor(3), temperature=T, top_p=0.5, nucleus=one)  # token 3 is 4th
    assert torch.isfinite(logp) and float(logp) < 0
    torch.testing.assert_close(logp, torch.log(torch.tensor(0.05 / 0.55)), atol=1e-6, rtol=0)
