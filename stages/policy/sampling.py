"""The sampling distribution of a rollout, as pure functions every backend and the learner share.

Rollouts sample a token from softmax(logits / T) restricted to the top-p nucleus and renormalised (the
Selective Rollout setup: T = 0.7, top-p 0.95). The behaviour log-prob recorded at sampling and the
log-prob the learner recomputes are both log mu(token) under *that* distribution, so the importance
ratio exp(new - old) is pi/mu for the distribution that actually produced the data, and exactly 1 (up to
float rounding) while the weights are unchanged.

The nucleus is the smallest set of most likely tokens whose mass reaches top_p: a token is kept when the
mass of strictly more likely tokens is < top_p (so at least one token is always kept). When scoring a
given token, the nucleus is widened to include that token: at the weights that sampled it this changes
nothing (a sampled token is in its nucleus), and after the weights move it keeps the log-prob finite.

The nucleus is recorded, not recomputed. Whether a token at the boundary is in the nucleus is a
discontinuous function of the logits: when the mass before it sits within float rounding of top_p, a
last-bit difference in the logits (another batch's padding and shapes, another thread count, the KV-cached
decoding against the learner's full forward) moves the token in or out and the log-prob by its share of
the mass (seen: 4e-3). So sampling records each token's nucleus *size* k (`nucleus_sizes`), samples from
and scores under the top-k of that step, and the learner scores the token under the top-k of its own
logits with the same k (`nucleus=`): the mass of the k most likely tokens is continuous in the logits,
so the ratio is 1 up to rounding whatever the batch. A size of 0 (not recorded: the vLLM engine does not
report its nucleus) falls back to the top-p rule.

Temperature <= 0 means greedy decoding, which has no sampling distribution: the model's own distribution
(T = 1, full vocabulary) is used, so greedy evaluation records finite, comparable log-probs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _effective(temperature: float, top_p: float) -> tuple[float, float]:
    return (1.0, 1.0) if temperature <= 0 else (temperature, top_p)


def nucleus_mask(logp: torch.Tensor, top_p: float, size: torch.Tensor | None = None) -> torch.Tensor:
    """Which tokens the nucleus keeps, in vocabulary order: the top-p rule, or where `size` > 0 the `size`
    most likely tokens (a nucleus recorded at sampling).

    Args:
        logp: [..., V] normalised log-probs (already temperature-scaled).
        size: [...] int, recorded nucleus sizes (0: the top-p rule), or None.
    Returns:
        [..., V] bool.
    """
    recorded = size is not None and bool((size > 0).any())
    if top_p >= 1.0 and not recorded:
        return torch.ones_like(logp, dtype=torch.bool)
    sorted_p, order = logp.exp().sort(dim=-1, descending=True)  # [..., V]
    before = sorted_p.cumsum(dim=-1) - sorted_p  # [..., V] mass of strictly more likely tokens
    kept = before < top_p  # [..., V] in sorted order
    if recorded:
        assert size is not None
        rank = torch.arange(logp.shape[-1], device=logp.device)  # [V]
        kept = torch.where(size[..., None] > 0, rank < size[..., None], kept)  # [..., V]
    return torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, kept)  # [..., V]


@torch.no_grad()
def nucleus_sizes(logits: torch.Tensor, *, temperature: float, top_p: float) -> torch.Tensor:
    """How many tokens the (temperature, top-p) nucleus keeps: [..., V] logits -> [...] int64 (the whole
    vocabulary when top_p >= 1 or temperature <= 0; float64 logits stay float64). What sampling records
    for each token."""
    temperature, top_p = _effective(temperature, top_p)
    if top_p >= 1.0:
        return torch.full(logits.shape[:-1], logits.shape[-1], dtype=torch.long, device=logits.device)
    logp = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)  # [..., V]
    return nucleus_mask(logp, top_p).sum(dim=-1)  # [...]


def sampled_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, *, temperature: float, top_p: float, nucleus: torch.Tensor | None = None
) -> torch.Tensor:
    """log mu(token) under the (temperature, top-p) distribution; differentiable in `logits`.

    Args:
        logits: [..., V] raw model logits.
        tokens: [...] token ids (int64).
        nucleus: [...] int, the nucleus sizes recorded at sampling (0 or None: the top-p rule).
    Returns:
        [...] log-probs (float32).
    """
    temperature, top_p = _effective(temperature, top_p)
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # [..., V]
    token_logp = logp.gather(-1, tokens[..., None]).squeeze(-1)  # [...]
    if top_p >= 1.0:
        return token_logp
    with torch.no_grad():
        kept = nucleus_mask(logp, top_p, nucleus)  # [..., V]
        kept.scatter_(-1, tokens[..., None], True)  # widened to the scored token
    log_mass = torch.logsumexp(logp.masked_fill(~kept, float("-inf")), dim=-1)  # [...]
    return token_logp - log_mass


@torch.no_grad()
def sampling_entropy(
    logits: torch.Tensor, *, temperature: float, top_p: float, nucleus: torch.Tensor | None = None
) -> torch.Tensor:
    """Entropy (nats) of the (temperature, top-p) distribution: [..., V] -> [...] (`nucleus` as in
    `sampled_logprobs`)."""
    temperature, top_p = _effective(temperature, top_p)
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # [..., V]
    kept = (nucleus_mask(logp, top_p, nucleus) if top_p < 1.0 else torch.ones_like(logp, dtype=torch.bool)) & torch.isfinite(logp)  # [..., V] (masked-out tokens are -inf)
    renorm = logp.masked_fill(~kept, float("-inf"))  # [..., V]
    renorm = renorm - torch.logsumexp(renorm, dim=-1, keepdim=True)
    p = renorm.exp()  # [..., V], 0 outside the nucleus
    return -(p * renorm.masked_fill(~kept, 0.0)).sum(dim=-1)
