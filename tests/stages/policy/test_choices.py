"""Constrained decoding's pure parts: the trie, the per-step and per-completion masks."""

from __future__ import annotations

import pytest
import torch

from stages.policy.choices import ChoiceTrie, completion_mask, mask_logits, step_mask

CHOICES = [[5, 6, 2], [5, 7, 2], [8, 2]]  # "a b", "a c", "d", each ending with the stop id 2


def test_the_trie_allows_exactly_the_continuations_of_a_prefix() -> None:
    trie = ChoiceTrie(CHOICES)
    assert trie.allowed([]) == [5, 8]
    assert trie.allowed([5]) == [6, 7]
    assert trie.allowed([5, 7]) == [2]
    assert trie.allowed([9]) is None  # off the trie: unconstrained
    assert ChoiceTrie([]).allowed([]) is None


def test_step_mask_constrains_rows_with_a_trie_and_frees_the_others() -> None:
    mask = step_mask([ChoiceTrie(CHOICES), None, ChoiceTrie(CHOICES)], [[], [], [5]], vocab=10)  # [3, 10]
    assert mask[0].nonzero().flatten().tolist() == [5, 8]
    assert bool(mask[1].all())
    assert mask[2].nonzero().flatten().tolist() == [6, 7]


def test_completion_mask_rebuilds_each_position_and_always_allows_the_scored_token() -> None:
    completions = [[5, 7, 2], [8, 2], [3, 3]]
    mask = completion_mask([CHOICES, CHOICES, CHOICES], completions, steps=3, vocab=10)  # [3, 3, 10]
    assert mask[0, 0].nonzero().flatten().tolist() == [5, 8]
    assert mask[0, 1].nonzero().flatten().tolist() == [6, 7]
    assert mask[0, 2].nonzero().flatten().tolist() == [2]
    assert bool(mask[1, 2].all())  # padding
    # A token the trie does not allow (recorded unconstrained) stays scoreable; after it, nothing is masked.
    assert mask[2, 0].nonzero().flatten().tolist() == [3, 5, 8]
    assert bool(mask[2, 1].all())
    free = completion_mask([[], CHOICES, CHOICES], completions, steps=3, vocab=10)
    assert bool(free[0].all())


def test_masked_logits_give_a_distribution_over_the_allowed_tokens_only() -> None:
    logits = torch.randn(2, 10, requires_grad=True)
    allowed = step_mask([ChoiceTrie(CHOICES), None], [[], []], vocab=10)
    probs = torch.softmax(mask_logits(logits, allowed), dim=-1)  # [2, 10]
    assert float(probs[0, [5, 8]].sum().detach()) == pytest.approx(1.0)
    assert float(probs[0, ~allowed[0]].sum().detach()) == 0.0
    probs[0, 5].log().backward()
    assert torch.isfinite(logits.grad).all() and float(logits.grad[0, ~allowed[0]].abs().sum()) == 0.0
