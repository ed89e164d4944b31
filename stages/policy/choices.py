"""Choosing among the admissible commands: decoding constrained to a trie of token sequences.

With `choices` (each admissible command's token ids, ending with its stop token), the policy may only emit
a token that continues one of them: the logits of every other token are masked to -inf *before* the
temperature / top-p distribution is formed. The sampled command is then always admissible, and its
log-prob is that of the constrained distribution — so the learner, which rebuilds the same mask from the
same `choices` recorded in the `Turn`, computes exactly the behaviour log-probs at unchanged weights.

A prefix that has left the trie (possible only for a completion recorded without the constraint) or an
empty `choices` constrains nothing. The scored token is always allowed (like the widened nucleus in
`stages.policy.sampling`), so a log-prob stays finite whatever was recorded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ChoiceTrie:
    """The tokens allowed after each prefix of a set of token sequences."""

    __slots__ = ("_next",)

    def __init__(self, choices: Sequence[Sequence[int]]) -> None:
        following: dict[tuple[int, ...], set[int]] = {}
        for seq in choices:
            for k in range(len(seq)):
                following.setdefault(tuple(seq[:k]), set()).add(seq[k])
        self._next = {prefix: sorted(tokens) for prefix, tokens in following.items()}

    def allowed(self, prefix: Sequence[int]) -> list[int] | None:
        """Token ids that may follow `prefix`; None when unconstrained (no choices, or off the trie)."""
        return self._next.get(tuple(prefix))


def step_mask(tries: Sequence[ChoiceTrie | None], prefixes: Sequence[Sequence[int]], vocab: int) -> torch.Tensor:
    """Which tokens each row may emit next: [B, V] bool (all True for an unconstrained row)."""
    mask = torch.ones(len(tries), vocab, dtype=torch.bool)  # [B, V]
    for row, (trie, prefix) in enumerate(zip(tries, prefixes, strict=True)):
        allowed = None if trie is None else trie.allowed(prefix)
        if allowed is not None:
            mask[row] = False
            mask[row, allowed] = True
    return mask


def completion_mask(
    choices: Sequence[Sequence[Sequence[int]]], completions: Sequence[Sequence[int]], steps: int, vocab: int
) -> torch.Tensor:
    """The mask each completion token was sampled under: [N, T, V] bool, T = `steps`.

    Row i, position t: the tokens allowed after completions[i][:t] by choices[i]; the scored token itself
    is always allowed; padding positions (t >= len) allow everything.
    """
    mask = torch.ones(len(completions), steps, vocab, dtype=torch.bool)  # [N, T, V]
    for i, (options, completion) in enumerate(zip(choices, completions, strict=True)):
        if not options:
            continue
        trie = ChoiceTrie(options)
        for t, token in enumerate(completion[:steps]):
            allowed = trie.allowed(completion[:t])
            if allowed is None:
                break
            mask[i, t] = False
            mask[i, t, allowed] = True
            mask[i, t, token] = True
    return mask


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """`logits` [..., V] with disallowed tokens at -inf (differentiable in the allowed ones)."""
    return logits.masked_fill(~allowed, float("-inf"))
