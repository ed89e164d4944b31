"""Batched sampling with a KV cache: prefill left-padded prompts once, then one token per step.

Randomness comes in as `uniforms` [B, max_new_tokens], one row per request, drawn by the caller from that
request's own generator. A token is chosen by inverting the (temperature, top-p) distribution's CDF at
the row's uniform, so a request's tokens depend on its own row only and not on which other requests share
its batch (padding changes logits only by float rounding, ~1e-6).

Recorded log-probs are those of the distribution each token was sampled from (temperature-scaled, top-p
renormalised; `stages.policy.sampling`), the same quantity the learner recomputes. With each token its
nucleus size is recorded: the token is drawn from, and its log-prob taken under, the k most likely tokens
of that step, and the learner scores it under the same k, so a last-bit difference between this batch's
logits and the learner's cannot move a boundary token in or out of the nucleus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from stages.policy.choices import ChoiceTrie, mask_logits, step_mask
from stages.policy.sampling import nucleus_sizes, sampled_logprobs, sampling_entropy

from ._commands import chosen_factors, command_logdist, command_scores
from ._model import KVCache, TinyLM


@dataclass(frozen=True, slots=True)
class Sample:
    token_ids: list[int]
    """Generated ids, ending with the stop token when one was generated."""
    logprobs: list[float]
    nucleus: list[int] = field(default_factory=list)
    """Each token's nucleus size (`stages.policy.sampling.nucleus_sizes`); [] when the distribution has no
    nucleus (top_p = 1 or temperature <= 0)."""
    entropy: float | None = None
    """Entropy (nats) of the choice: of the command distribution when a command is drawn whole, else the mean
    of each generated token's sampling entropy (`ActResult.entropy`); None where not computed."""


def choose_tokens(
    logits: torch.Tensor,  # [B, V]
    uniforms: torch.Tensor,  # [B] in [0, 1)
    greedy: torch.Tensor,  # [B] bool
    *,
    temperature: float,
    top_p: float,
    nucleus: torch.Tensor | None = None,  # [B] sizes
) -> torch.Tensor:
    """One token per row [B]: argmax where `greedy` (or temperature 0), else inverse-CDF sampling within the
    row's nucleus (`nucleus` sizes, default the top-p rule's on these logits)."""
    argmax = logits.argmax(dim=-1)  # [B]
    if temperature <= 0 or bool(greedy.all()):
        return argmax
    if nucleus is None:
        nucleus = nucleus_sizes(logits, temperature=temperature, top_p=top_p)  # [B]
    probs = F.softmax(logits.float() / temperature, dim=-1)  # [B, V]
    sorted_p, order = probs.sort(dim=-1, descending=True)  # [B, V]
    rank = torch.arange(logits.shape[-1], device=logits.device)  # [V]
    kept = torch.where(rank < nucleus[:, None], sorted_p, torch.zeros_like(sorted_p))  # [B, V] nucleus (>= 1 token)
    cdf = kept.cumsum(dim=-1)  # [B, V]
    target = uniforms[:, None].to(cdf.dtype) * cdf[:, -1:]  # [B, 1]
    rank = torch.searchsorted(cdf, target, right=True).clamp(max=logits.shape[-1] - 1)  # [B, 1]
    sampled = order.gather(-1, rank).squeeze(-1)  # [B]
    return torch.where(greedy, argmax, sampled)


@torch.inference_mode()
def generate(
    model: TinyLM,
    prompts: Sequence[Sequence[int]],
    *,
    uniforms: torch.Tensor,  # [B, max_new_tokens]
    greedy: Sequence[bool],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stop_ids: Sequence[int],
    choices: Sequence[Sequence[Sequence[int]]] | None = None,
) -> list[Sample]:
    """Sample a completion for each prompt (prompts must fit `max_len - max_new_tokens`).

    With `choices` (per prompt: token sequences, each ending with a stop id; empty = free), each row may
    only emit a continuation of one of its sequences (`stages.policy.choices`), or, when the model chooses
    by command (`TinyLM.choose_by`), one of them is drawn whole (`_commands.py`).
    """
    if choices is None or model.choose_by != "command" or not any(choices):
        tries = [ChoiceTrie(c) if c else None for c in choices] if choices is not None else None
        return _decode_tokens(model, prompts, uniforms, greedy, tries, max_new_tokens, temperature, top_p, stop_ids)
    rows = [i for i, c in enumerate(choices) if c]
    free = [i for i, c in enumerate(choices) if not c]
    drawn = _draw_commands(
        model, [prompts[i] for i in rows], [choices[i] for i in rows], uniforms[rows, 0], [greedy[i] for i in rows],
        width=max_new_tokens, temperature=temperature, top_p=top_p,
    )
    out = dict(zip(rows, drawn, strict=True))
    if free:  # rows without choices decode freely beside them
        decoded = _decode_tokens(model, [prompts[i] for i in free], uniforms[free], [greedy[i] for i in free], None,
                                 max_new_tokens, temperature, top_p, stop_ids)
        out |= dict(zip(free, decoded, strict=True))
    return [out[i] for i in range(len(prompts))]


def _decode_tokens(
    model: TinyLM, prompts: Sequence[Sequence[int]], uniforms: torch.Tensor, greedy: Sequence[bool],
    tries: list[ChoiceTrie | None] | None, max_new_tokens: int, temperature: float, top_p: float, stop_ids: Sequence[int],
) -> list[Sample]:
    """`generate` token by token: prefill the left-padded prompts once, then one cached step per token, each
    row masked by its trie (None: free)."""
    cfg = model.cfg
    B, P = len(prompts), max(len(p) for p in prompts)
    if P + max_new_tokens > cfg.max_len:
        raise ValueError(f"prompt ({P}) + max_new_tokens ({max_new_tokens}) exceeds max_len={cfg.max_len}")
    ids = torch.full((B, P), cfg.pad_id, dtype=torch.long)  # [B, P] left-padded
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
    lengths = torch.tensor([len(p) for p in prompts])  # [B]
    key_mask = torch.ones(B, P + max_new_tokens, dtype=torch.bool)  # [B, S]
    key_mask[:, :P] = torch.arange(P)[None, :] >= (P - lengths)[:, None]
    positions = (key_mask[:, :P].long().cumsum(dim=-1) - 1).clamp(min=0)  # [B, P]
    next_pos = lengths.clone()  # [B]
    greedy_t = torch.tensor(list(greedy), dtype=torch.bool)  # [B]
    stops = torch.tensor(list(stop_ids))  # [K]
    device = model.tok_emb.weight.device  # built on the CPU, moved once (a no-op on the CPU)
    ids, key_mask, positions, next_pos, greedy_t, stops, uniforms = (
        t.to(device) for t in (ids, key_mask, positions, next_pos, greedy_t, stops, uniforms)
    )
    cache = KVCache.empty(cfg, B, P + max_new_tokens, device=device)

    h = model.hidden(ids, positions, key_mask[:, :P], cache, start=0)[:, -1]  # [B, D]
    tokens = torch.empty(B, max_new_tokens, dtype=torch.long, device=device)  # [B, N]
    logps = torch.empty(B, max_new_tokens, device=device)  # [B, N]
    nuclei = torch.empty(B, max_new_tokens, dtype=torch.long, device=device)  # [B, N]
    entropies = torch.empty(B, max_new_tokens, device=device)  # [B, N]
    done = torch.zeros(B, dtype=torch.bool, device=device)  # [B]
    steps = 0
    for t in range(max_new_tokens):
        logits = model.logits(h).float()  # [B, V]
        if tries is not None:
            logits = mask_logits(logits, step_mask(tries, tokens[:, :t].tolist(), logits.shape[-1]).to(logits.device))
        sizes = nucleus_sizes(logits, temperature=temperature, top_p=top_p)  # [B]
        tok = choose_tokens(logits, uniforms[:, t], greedy_t, temperature=temperature, top_p=top_p, nucleus=sizes)  # [B]
        tokens[:, t] = tok
        logps[:, t] = sampled_logprobs(logits, tok, temperature=temperature, top_p=top_p, nucleus=sizes)
        nuclei[:, t] = sizes
        entropies[:, t] = sampling_entropy(logits, temperature=temperature, top_p=top_p, nucleus=sizes)
        steps = t + 1
        done |= torch.isin(tok, stops)
        if bool(done.all()) or steps == max_new_tokens:
            break
        col = P + t
        h = model.hidden(tok[:, None], next_pos[:, None], key_mask[:, : col + 1], cache, start=col)[:, -1]
        next_pos = next_pos + 1

    recorded = _has_nucleus(temperature, top_p)
    samples = []
    rows = zip(tokens[:, :steps].tolist(), logps[:, :steps].tolist(), nuclei[:, :steps].tolist(),
               entropies[:, :steps].tolist(), strict=True)
    for row, lp, k, ent in rows:
        end = next((j + 1 for j, x in enumerate(row) if x in stop_ids), len(row))
        samples.append(Sample(row[:end], lp[:end], k[:end] if recorded else [], sum(ent[:end]) / end))
    return samples


def _has_nucleus(temperature: float, top_p: float) -> bool:
    return temperature > 0 and top_p < 1.0


@torch.inference_mode()
def generate_uncached(
    model: TinyLM,
    prompts: Sequence[Sequence[int]],
    *,
    uniforms: torch.Tensor,  # [B, max_new_tokens]
    greedy: Sequence[bool],
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stop_ids: Sequence[int],
) -> list[Sample]:
    """The same sampling as `generate`, recomputing the whole sequence each step (reference / bench)."""
    B = len(prompts)
    rows = [list(p) for p in prompts]
    greedy_t = torch.tensor(list(greedy), dtype=torch.bool)
    out: list[Sample] = [Sample([], []) for _ in range(B)]
    live = list(range(B))
    for t in range(max_new_tokens):
        L = max(len(rows[i]) for i in live)
        ids = torch.full((len(live), L), model.cfg.pad_id, dtype=torch.long)  # [B', L] left-padded
        for j, i in enumerate(live):
            ids[j, L - len(rows[i]) :] = torch.tensor(rows[i])
        lengths = torch.tensor([len(rows[i]) for i in live])  # [B']
        key_mask = torch.arange(L)[None, :] >= (L - lengths)[:, None]  # [B', L]
        positions = (key_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # [B', L]
        logits = model.logits(model.hidden(ids, positions, key_mask)[:, -1]).float()  # [B', V]
        sizes = nucleus_sizes(logits, temperature=temperature, top_p=top_p)  # [B']
        tok = choose_tokens(logits, uniforms[live, t], greedy_t[live], temperature=temperature, top_p=top_p, nucleus=sizes)
        logp = sampled_logprobs(logits, tok, temperature=temperature, top_p=top_p, nucleus=sizes)  # [B']
        for j, i in enumerate(live):
            out[i].token_ids.append(int(tok[j]))
            out[i].logprobs.append(float(logp[j]))
            if _has_nucleus(temperature, top_p):
                out[i].nucleus.append(int(sizes[j]))
            rows[i].append(int(tok[j]))
        live = [i for i in live if out[i].token_ids[-1] not in stop_ids]
        if not live:
            break
    return out


def _draw_commands(
    model: TinyLM,
    prompts: Sequence[Sequence[int]],
    choices: Sequence[Sequence[Sequence[int]]],
    uniforms: torch.Tensor,  # [n] one per row
    greedy: Sequence[bool],
    *,
    width: int,
    temperature: float,
    top_p: float,
) -> list[Sample]:
    """One whole command per row (`_commands.py`), recorded with its next-token log-probs."""
    scores = command_scores(model, prompts, choices)  # [n, K]
    sizes = nucleus_sizes(scores.double(), temperature=temperature, top_p=top_p)  # [n] commands in each nucleus
    greedy_t = torch.tensor(list(greedy), device=scores.device)  # [n]
    picked = choose_tokens(scores, uniforms.to(scores.device), greedy_t, temperature=temperature, top_p=top_p, nucleus=sizes)  # [n]
    logp, _ = chosen_factors(
        scores, choices, picked, width, temperature=temperature, top_p=top_p, vocab=model.cfg.vocab_size, nucleus=sizes
    )  # [n, width]
    commands = [list(options[int(j)]) for options, j in zip(choices, picked, strict=True)]
    recorded = _has_nucleus(temperature, top_p)
    entropy = command_entropy(command_logdist(scores, picked, temperature=temperature, top_p=top_p, nucleus=sizes)).tolist()  # [n]
    return [Sample(c, logp[r, : len(c)].tolist(), [int(sizes[r])] * len(c) if recorded else [], entropy[r])
            for r, c in enumerate(commands)]


def command_entropy(logdist: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row's distribution over commands: [N, K] log-probs (-inf outside) -> [N]."""
    p = logdist.exp()  # [N, K], 0 where -inf
    return -(p * logdist.masked_fill(~torch.isfinite(logdist), 0.0)).sum(dim=-1)
