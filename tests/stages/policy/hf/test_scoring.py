"""Command scores under a transformers model: the shared-prefix KV cache, repeated rows, the factors."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers", reason="the hf backend needs transformers (the `hf` extra)")

from stages.policy.hf._scoring import choice_logprobs, choice_scores, compact, row_scores  # noqa: E402
from stages.policy.torch_tiny._commands import command_logdist  # noqa: E402

PROMPTS = [[1, 5, 6, 7, 8], [1, 9, 10, 7], [1, 5, 6, 7, 8]]
CHOICES = [[[11, 12, 2], [11, 13, 2], [14, 2], [15, 16, 17, 18, 2]], [[11, 2], [19, 2]], [[11, 12, 2], [11, 13, 2], [14, 2], [15, 16, 17, 18, 2]]]


def _full_forward(lm, prompt, command) -> float:  # noqa: ANN001
    """log p(command | prompt) from one forward of prompt + command, no cache."""
    with torch.no_grad():
        logp = lm(torch.tensor([[*prompt, *command]])).logits.log_softmax(-1)[0]  # [L, V]
    return sum(float(logp[len(prompt) - 1 + t, token]) for t, token in enumerate(command))


def test_scores_with_the_shared_prompt_cache_are_the_full_forward_scores(lm) -> None:  # noqa: ANN001
    with torch.no_grad():
        scores = row_scores(lm, PROMPTS[0], CHOICES[0])  # [4]
    expected = [_full_forward(lm, PROMPTS[0], c) for c in CHOICES[0]]
    torch.testing.assert_close(scores, torch.tensor(expected), atol=1e-4, rtol=1e-5)
    assert len(set(scores.tolist())) == 4  # distinct commands, distinct scores


def test_one_token_commands_need_no_second_forward(lm) -> None:  # noqa: ANN001
    with torch.no_grad():
        scores = row_scores(lm, PROMPTS[1], [[11], [19]])
    torch.testing.assert_close(scores, torch.tensor([_full_forward(lm, PROMPTS[1], [t]) for t in (11, 19)]), atol=1e-4, rtol=1e-5)


def test_a_row_scores_the_same_alone_and_in_any_batch(lm) -> None:  # noqa: ANN001
    with torch.no_grad():
        together = choice_scores(lm, PROMPTS, CHOICES)  # [3, 4]
        alone = [choice_scores(lm, [p], [c]) for p, c in zip(PROMPTS, CHOICES, strict=True)]
        reversed_ = choice_scores(lm, PROMPTS[::-1], CHOICES[::-1])
    assert together.shape == (3, 4)
    assert torch.isinf(together[1, 2:]).all() and bool(torch.isfinite(together[1, :2]).all())  # fewer commands: -inf
    for i, row in enumerate(alone):
        assert torch.equal(together[i, : row.shape[1]], row[0])
        assert torch.equal(reversed_[2 - i, : row.shape[1]], row[0])


def test_a_repeated_row_is_scored_once_and_its_gradient_counts_twice(lm) -> None:  # noqa: ANN001
    calls = []
    decoder = lm.get_decoder()
    forward = decoder.forward

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return forward(*args, **kwargs)

    decoder.forward = counted
    scores = choice_scores(lm, PROMPTS, CHOICES)
    assert len(calls) == 4  # two distinct rows, two forwards each (prefill, commands)
    assert torch.equal(scores[0], scores[2])
    scores[0, 0].backward(retain_graph=True)
    once = lm.get_input_embeddings().weight.grad.clone()
    lm.zero_grad()
    (scores[0, 0] + scores[2, 0]).backward()
    torch.testing.assert_close(lm.get_input_embeddings().weight.grad, 2 * once)


def test_compact_renumbers_tokens_keeping_which_are_equal() -> None:
    local, vocab = compact([[[40, 7, 2], [40, 9, 2]], [[7, 2]]])
    assert local == [[[0, 1, 2], [0, 3, 2]], [[1, 2]]] and vocab == 4


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 0.95), (0.5, 0.5), (1.0, 1.0)])
def test_the_factors_of_a_chosen_command_sum_to_its_log_prob_under_the_command_policy(temperature, top_p) -> None:  # noqa: ANN001
    scores = torch.tensor([[-1.0, -1.5, -4.0, -2.0], [-0.5, -3.0, float("-inf"), float("-inf")]], dtype=torch.float64)
    choices = [CHOICES[0], CHOICES[1]]
    for j in range(2):
        chosen = torch.tensor([j, j])
        logp, entropy = choice_logprobs(scores, choices, chosen, temperature=temperature, top_p=top_p)
        expected = command_logdist(scores, chosen, temperature=temperature, top_p=top_p)[torch.arange(2), chosen]
        torch.testing.assert_close(logp.sum(dim=1).double(), expected, atol=1e-6, rtol=0)
        assert bool((entropy >= 0).all())
    # the shared first token of commands 0 and 1 carries their joint mass
    logp, _ = choice_logprobs(scores, choices, torch.tensor([0, 0]), temperature=1.0, top_p=1.0)
    p = torch.softmax(scores[0], -1)
    assert float(logp[0, 0]) == pytest.approx(math.log(float(p[0] + p[1])), abs=1e-6)
