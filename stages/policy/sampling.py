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

Temperature <= 0 means greedy decoding, which has no sampling distribution: the model's own distribution
(T = 1, full vocabulary) is used, so greedy evaluation records finite, comparable log-probs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _effective(temperature: float, top_p: float) -> tuple[float, float]:
    return (1.0, 1.0) if temperature <= 0 else (temperature, top_p)


def nucleus_mask(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens the top-p nucleus keeps, in vocabulary order.

    Args:
        logp: [..., V] normalised log-probs (already temperature-scaled).
    Returns:
        [..., V] bool.
    """
    if top_p >= 1.0:
        return torch.ones_like(logp, dtype=torch.bool)
    sorted_p, order = logp.exp().sort(dim=-1, descending=True)  # [..., V]
    before = sorted_p.cumsum(dim=-1) - sorted_p  # [..., V] mass of strictly more likely tokens
    return torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before < top_p)  # [..., V]


def sampled_logprobs(logits: torch.Tensor, tokens: torch.Tensor, *, temperature: float, top_p: float) -> torch.Tensor:
    """log mu(token) under the (temperature, top-p) distribution; differentiable in `logits`.

    Args:
        logits: [..., V] raw model logits.
        tokens: [...] token ids (int64).
    Returns:
        [...] log-probs (float32).
    """
    temperature, top_p = _effective(temperature, top_p)
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # [..., V]
    token_logp = logp.gather(-1, tokens[..., None]).squeeze(-1)  # [...]
    if top_p >= 1.0:
        return token_logp
    with torch.no_grad():
        kept = nucleus_mask(logp, top_p)  # [..., V]
        kept.scatter_(-1, tokens[..., None], True)  # widened to the scored token
    log_mass = torch.logsumexp(logp.masked_fill(~kept, float("-inf")), dim=-1)  # [...]
    return token_logp - log_mass


@torch.no_grad()
def sampling_entropy(logits: torch.Tensor, *, temperature: float, top_p: float) -> torch.Tensor:
    """Entropy (nats) of the (temperature, top-p) distribution: [..., V] -> [...]."""
    temperature, top_p = _effective(temperature, top_p)
    logp = F.log_softmax(logits.float() / temperature, dim=-1)  # [..., V]
    kept = nucleus_mask(logp, top_p) & torch.isfinite(logp)  # [..., V] (masked-out tokens are -inf)
    renorm = logp.masked_fill(~kept, float("-inf"))  # [..., V]
    renorm = renorm - torch.logsumexp(renorm, dim=-1, keepdim=True)
    p = renorm.exp()  # [..., V], 0 outside the nucleus
    return -(p * renorm.masked_fill(~kept, 0.0)).sum(dim=-1)
