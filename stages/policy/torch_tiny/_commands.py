"""Choosing a whole command: the policy's distribution over the admissible commands, scored end to end.

Token-level constrained decoding (`stages.policy.choices`) picks the first word before it sees the rest:
in the household env "take" is chosen before *which* object, so the warm start takes whatever lies in
reach (docs/learning.md, "Why RL does not lift the warm start"). With `policy.options.choose_by =
"command"` each admissible command c is scored by the language model as a whole,

    score(c) = sum_t log p_theta(c_t | prompt, c_<t)        (temperature 1, full vocabulary)

and the action is drawn from softmax(score / T) over the commands, restricted to the top-p nucleus
(greedy: the argmax). That is the model's own distribution conditioned on emitting an admissible
command, so behaviour cloning (which trains p_theta on the expert's commands) raises it too.

The learner scores tokens, so the command distribution is written as a product of next-token
distributions over the trie of commands: pi(c_t | c_<t) = mass of the commands that continue c_<t with c_t,
divided by the mass of those that continue c_<t. The token log-probs sum to log pi(c) exactly, so
clipping, aggregation and the KL figures work unchanged.

All commands of a prompt are scored in one packed row: the prompt, then every command, each command
attending to the prompt and to its own earlier tokens only (positions restart after the prompt), so the
prompt is encoded once however many commands there are. Rows that repeat an earlier row (the same prompt
and commands: rollouts of one group that acted alike so far, decoded in one batch or trained in one
micro-batch) are encoded once too (`distinct_rows`); their scores are copies, and gradients add up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from stages.policy.sampling import nucleus_mask

if TYPE_CHECKING:
    from ._model import TinyLM


@dataclass(frozen=True, slots=True)
class Packed:
    """Prompts and their commands, one row each (`pack`)."""

    ids: torch.Tensor  # [N, L] right-padded
    positions: torch.Tensor  # [N, L]
    allowed: torch.Tensor  # [N, 1, L, L] bool: which keys each query attends
    predict_at: torch.Tensor  # [N, M] the position whose output scores each command token
    targets: torch.Tensor  # [N, M] the command tokens (pad: 0)
    owner: torch.Tensor  # [N, M] which command each token belongs to (pad: K)
    commands: int  # K, the most commands of any row


def pack(prompts: Sequence[Sequence[int]], choices: Sequence[Sequence[Sequence[int]]], pad_id: int) -> Packed:
    """Lay out each prompt followed by all of its commands (see the module doc). Pure tensor building."""
    rows, positions, segments, predict, targets, owners = [], [], [], [], [], []
    for prompt, options in zip(prompts, choices, strict=True):
        p = len(prompt)
        row, pos, seg = list(prompt), list(range(p)), [-1] * p
        pr, tg, ow = [], [], []
        for j, command in enumerate(options):
            at = len(row)
            for t, token in enumerate(command):
                pr.append(p - 1 if t == 0 else at + t - 1)
                tg.append(token)
                ow.append(j)
            row += command
            pos += range(p, p + len(command))
            seg += [j] * len(command)
        rows.append(row)
        positions.append(pos)
        segments.append(seg)
        predict.append(pr)
        targets.append(tg)
        owners.append(ow)
    N, L = len(rows), max(map(len, rows))
    M, K = max(1, max(map(len, targets))), max(1, max(len(c) for c in choices))
    ids = torch.full((N, L), pad_id, dtype=torch.long)
    pos_t = torch.zeros(N, L, dtype=torch.long)
    seg_t = torch.full((N, L), -2, dtype=torch.long)  # -1 prompt, j command j, -2 padding
    predict_t = torch.zeros(N, M, dtype=torch.long)
    target_t = torch.zeros(N, M, dtype=torch.long)
    owner_t = torch.full((N, M), K, dtype=torch.long)
    for i in range(N):
        n, m = len(rows[i]), len(targets[i])
        ids[i, :n] = torch.tensor(rows[i])
        pos_t[i, :n] = torch.tensor(positions[i])
        seg_t[i, :n] = torch.tensor(segments[i])
        predict_t[i, :m] = torch.tensor(predict[i], dtype=torch.long)
        target_t[i, :m] = torch.tensor(targets[i], dtype=torch.long)
        owner_t[i, :m] = torch.tensor(owners[i], dtype=torch.long)
    q, k = seg_t[:, :, None], seg_t[:, None, :]  # [N, L, 1], [N, 1, L]
    causal = torch.ones(L, L, dtype=torch.bool).tril()  # [L, L]
    allowed = causal & (k != -2) & ((k == -1) | (k == q))  # [N, L, L]
    allowed |= torch.eye(L, dtype=torch.bool)  # a padding query attends itself (never an empty softmax)
    return Packed(ids, pos_t, allowed[:, None], predict_t, target_t, owner_t, K)


def distinct_rows(
    prompts: Sequence[Sequence[int]], choices: Sequence[Sequence[Sequence[int]]]
) -> tuple[list[int], list[int]]:
    """(first: the index of each distinct (prompt, commands) row in first-seen order, inverse: for each
    row, its position in `first`). Pure."""
    seen: dict[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    for i, (prompt, options) in enumerate(zip(prompts, choices, strict=True)):
        key = (tuple(prompt), tuple(map(tuple, options)))
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        inverse.append(seen[key])
    return first, inverse


def command_scores(
    model: TinyLM, prompts: Sequence[Sequence[int]], choices: Sequence[Sequence[Sequence[int]]]
) -> torch.Tensor:
    """score(c) = log p_theta(c | prompt) of each command: [N, K], -inf where a row has fewer commands.
    Differentiable in the model's weights. A repeated row is encoded once (`distinct_rows`)."""
    first, inverse = distinct_rows(prompts, choices)
    if len(first) < len(prompts):
        scores = every_row_scores(model, [prompts[i] for i in first], [choices[i] for i in first])  # [U, K]
        return scores[torch.tensor(inverse, device=scores.device)]  # [N, K]
    return every_row_scores(model, prompts, choices)


def every_row_scores(
    model: TinyLM, prompts: Sequence[Sequence[int]], choices: Sequence[Sequence[Sequence[int]]]
) -> torch.Tensor:
    """Scores [N, K] of every row as given, a repeated row encoded again (what `command_scores` saves)."""
    device = model.tok_emb.weight.device
    packed = pack(prompts, choices, model.cfg.pad_id)
    h = model.hidden(packed.ids.to(device), packed.positions.to(device), allowed=packed.allowed.to(device))  # [N, L, D]
    predict_at = packed.predict_at.to(device)
    h = h.gather(1, predict_at[..., None].expand(-1, -1, h.shape[-1]))  # [N, M, D]
    logp = torch.log_softmax(model.logits(h).float(), dim=-1)  # [N, M, V]
    token_logp = logp.gather(-1, packed.targets.to(device)[..., None]).squeeze(-1)  # [N, M]
    N = token_logp.shape[0]
    sums = torch.zeros(N, packed.commands + 1, device=device).scatter_add(1, packed.owner.to(device), token_logp)
    counts = torch.tensor([len(c) for c in choices], device=device)  # [N]
    present = torch.arange(packed.commands, device=device)[None, :] < counts[:, None]  # [N, K]
    return sums[:, : packed.commands].masked_fill(~present, float("-inf"))


def command_logdist(
    scores: torch.Tensor, chosen: torch.Tensor, *, temperature: float, top_p: float, nucleus: torch.Tensor | None = None
) -> torch.Tensor:
    """log pi over the commands [N, K] (float64): softmax(scores / T) in the top-p nucleus (or the `nucleus`
    [N] most likely commands recorded at sampling, 0: the rule), widened to `chosen` [N] (as
    `stages.policy.sampling` widens it to a scored token); -inf outside. T <= 0: T = 1."""
    if temperature <= 0:
        temperature, top_p = 1.0, 1.0
    logp = torch.log_softmax(scores.double() / temperature, dim=-1)  # [N, K]
    if top_p < 1.0:
        with torch.no_grad():
            kept = nucleus_mask(logp, top_p, nucleus)  # [N, K]
            kept.scatter_(-1, chosen[:, None], True)
        logp = logp.masked_fill(~kept, float("-inf"))
        logp = logp - torch.logsumexp(logp, dim=-1, keepdim=True)
    return logp


def token_factors(
    logdist: torch.Tensor,  # [N, K] log pi over the commands
    options: torch.Tensor,  # [N, K, T] each command's tokens, -1 past its end
    chosen: torch.Tensor,  # [N, T] the chosen command's tokens, -1 past its end
    vocab: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """pi(chosen) as next-token factors: (log-probs [N, T], entropies [N, T]); 0 past the command's end.

    Token t's distribution is the mass of the commands that share chosen[:t], by their token t.
    """
    N, K, T = options.shape
    same = options == chosen[:, None, :]  # [N, K, T]
    shares = torch.cat([torch.ones(N, K, 1, dtype=torch.bool, device=same.device), same[:, :, :-1]], dim=-1).cumprod(dim=-1).bool()  # [N, K, T]
    prob = logdist.exp()  # [N, K]
    weight = prob[:, :, None] * shares  # [N, K, T] mass of the commands on the chosen prefix
    index = options.clamp(min=0).transpose(1, 2)  # [N, T, K]
    mass = torch.zeros(N, T, vocab, dtype=prob.dtype, device=prob.device).scatter_add(-1, index, weight.transpose(1, 2))  # [N, T, V]
    total = mass.sum(dim=-1)  # [N, T]
    real = chosen >= 0  # [N, T]
    picked = mass.gather(-1, chosen.clamp(min=0)[..., None]).squeeze(-1)  # [N, T]
    logp = torch.where(real, picked.clamp(min=1e-300).log() - total.clamp(min=1e-300).log(), 0.0)  # [N, T]
    with torch.no_grad():
        p = mass / total.clamp(min=1e-300)[..., None]  # [N, T, V]
        entropy = torch.where(real, -(p * p.clamp(min=1e-300).log()).sum(dim=-1), 0.0)  # [N, T]
    return logp.float(), entropy.float()


def padded_commands(choices: Sequence[Sequence[Sequence[int]]], width: int) -> torch.Tensor:
    """[N, K, width] token ids, -1 past each command's end and for missing commands."""
    K = max(1, max(len(c) for c in choices))
    out = torch.full((len(choices), K, width), -1, dtype=torch.long)
    for i, options in enumerate(choices):
        for j, command in enumerate(options):
            out[i, j, : len(command)] = torch.tensor(command[:width])
    return out


def chosen_factors(
    scores: torch.Tensor,  # [N, K] command_scores
    choices: Sequence[Sequence[Sequence[int]]],
    chosen: torch.Tensor,  # [N] index of each row's command
    width: int,
    *,
    temperature: float,
    top_p: float,
    vocab: int,
    nucleus: torch.Tensor | None = None,  # [N] recorded command-nucleus sizes (0: the top-p rule)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs and entropies [N, width] of each row's chosen command under the command policy."""
    logdist = command_logdist(scores, chosen, temperature=temperature, top_p=top_p, nucleus=nucleus)  # [N, K]
    options = padded_commands(choices, width).to(scores.device)  # [N, K, width]
    picked = options[torch.arange(len(choices), device=scores.device), chosen]  # [N, width]
    return token_factors(logdist, options, picked, vocab)
