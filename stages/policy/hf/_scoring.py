"""Scoring admissible commands under a Hugging Face causal LM, the prompt encoded once per row.

score(c) = sum_t log p_theta(c_t | prompt, c_<t) (temperature 1, full vocabulary), the torch policy's
`choose_by = "command"` score (`stages/policy/torch_tiny/_commands.py`), computed here with the model's
own KV cache: the prompt is prefilled once, its cache is repeated for the K commands, and the commands
(right-padded, without their last token, which is only predicted) run as one batch of K rows on top of
it. The hidden state that predicts a command's first token is the prompt's last one. Nothing else is
batched: each (prompt, commands) row is computed alone, so a row's scores are the same whatever rows
share its batch, and the serving policy (no grad) and the learner (with grad) run the same function.

The command distribution and its next-token factors are torch_tiny's (`command_logdist`,
`token_factors` through `chosen_factors`); the factors only compare token ids, so they are computed over
the batch's own tokens renumbered 0..U-1 (`compact`), not over a 49 k-token vocabulary.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from stages.policy.torch_tiny._commands import chosen_factors, distinct_rows


def row_scores(lm: Any, prompt: Sequence[int], commands: Sequence[Sequence[int]]) -> torch.Tensor:
    """score(c) [K] of each command given `prompt` (differentiable in the model's weights).

    `lm` is a `transformers` causal LM (or a peft model wrapping one); every command is non-empty.
    """
    decoder, head = lm.get_decoder(), lm.get_output_embeddings()
    device = head.weight.device
    K, C = len(commands), max(len(c) for c in commands)
    name = cache_name(decoder)
    out = decoder(input_ids=torch.tensor([list(prompt)], device=device), use_cache=True)
    last = out.last_hidden_state[:, -1:]  # [1, 1, D] predicts every command's first token
    targets = torch.zeros(K, C, dtype=torch.long)  # [K, C] right-padded (the padding is never read)
    real = torch.zeros(K, C, dtype=torch.bool)  # [K, C]
    for j, command in enumerate(commands):
        targets[j, : len(command)] = torch.tensor(list(command), dtype=torch.long)
        real[j, : len(command)] = True
    targets, real = targets.to(device), real.to(device)
    predict = last.expand(K, 1, last.shape[-1])  # [K, 1, D]
    if C > 1:
        cache = getattr(out, name)
        cache.batch_repeat_interleave(K)
        h = decoder(input_ids=targets[:, :-1], use_cache=True, **{name: cache}).last_hidden_state  # [K, C-1, D]
        predict = torch.cat([predict, h], dim=1)  # [K, C, D]
    logits = head(predict).float()  # [K, C, V]
    token_logp = logits.gather(-1, targets[..., None]).squeeze(-1) - logits.logsumexp(dim=-1)  # [K, C]
    return torch.where(real, token_logp, 0.0).sum(dim=-1)  # [K]


def cache_name(decoder: Any) -> str:
    """What the decoder calls its KV cache, as a keyword and an output field: `cache` (transformers >= 5.2x)
    or `past_key_values` (before; deprecated after)."""
    return "cache" if "cache" in inspect.signature(type(decoder).forward).parameters else "past_key_values"


def choice_scores(lm: Any, prompts: Sequence[Sequence[int]], choices: Sequence[Sequence[Sequence[int]]]) -> torch.Tensor:
    """Scores [N, K] of every row's commands, -inf where a row has fewer than K; a row that repeats an
    earlier one (the same prompt and commands) is computed once and copied (gradients add up)."""
    first, inverse = distinct_rows(prompts, choices)
    K = max(len(c) for c in choices)
    rows = []
    for i in first:
        scores = row_scores(lm, prompts[i], choices[i])  # [k]
        rows.append(torch.cat([scores, scores.new_full((K - len(scores),), float("-inf"))]))
    stacked = torch.stack(rows)  # [U, K]
    return stacked[torch.tensor(inverse, device=stacked.device)]  # [N, K]


def compact(choices: Sequence[Sequence[Sequence[int]]]) -> tuple[list[list[list[int]]], int]:
    """The same commands with their token ids renumbered 0..U-1 in first-seen order, and U. Pure."""
    ids: dict[int, int] = {}
    out = [[[ids.setdefault(t, len(ids)) for t in command] for command in options] for options in choices]
    return out, max(1, len(ids))


def choice_logprobs(
    scores: torch.Tensor,  # [N, K]
    choices: Sequence[Sequence[Sequence[int]]],
    chosen: torch.Tensor,  # [N] the index of each row's command
    *,
    temperature: float,
    top_p: float,
    nucleus: torch.Tensor | None = None,  # [N] command-nucleus sizes recorded at sampling (0: the top-p rule)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's chosen command under softmax(scores / T) in its nucleus, as next-token factors: token
    log-probs and entropies [N, W], W the longest command (0 past a command's end)."""
    local, vocab = compact(choices)
    width = max(len(c) for options in choices for c in options)
    return chosen_factors(scores, local, chosen, width, temperature=temperature, top_p=top_p, vocab=vocab, nucleus=nucleus)
