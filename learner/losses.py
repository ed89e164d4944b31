"""Policy-gradient token losses, one registered function per variant (no string switches in the hot path).

Every loss has the signature

    loss_fn(new_logprobs [N, T], old_logprobs [N, T], advantages [N], mask [N, T], *, clip_eps) -> (loss, stats)

where N counts training items (one policy turn of one trajectory each), T the longest completion, and
`mask` is 1.0 on real tokens. `stats` holds detached floats for logging (`learner/...` keys).
"""

from __future__ import annotations

import torch

from pipeline.registry import Registry

Stats = dict[str, float]


def _clipped_surrogate(
    new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    ratio = torch.exp(new_logprobs - old_logprobs)  # [N, T]
    adv = advantages[:, None]  # [N, 1]
    unclipped = ratio * adv  # [N, T]
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv  # [N, T]
    return -torch.minimum(unclipped, clipped), ratio  # [N, T] per-token loss, [N, T]


def _stats(ratio: torch.Tensor, mask: torch.Tensor, clip_eps: float) -> Stats:
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        clipped = ((ratio - 1).abs() > clip_eps).float()
        return {
            "learner/ratio_mean": float((ratio * mask).sum() / n),
            "learner/clip_fraction": float((clipped * mask).sum() / n),
            "learner/tokens": float(mask.sum()),
        }


def clipped_ratio_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
) -> tuple[torch.Tensor, Stats]:
    """GRPO's clipped importance-ratio loss: token mean within each item, then mean over items."""
    per_token, ratio = _clipped_surrogate(new_logprobs, old_logprobs, advantages, clip_eps)  # [N, T]
    per_item = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [N]
    return per_item.mean(), _stats(ratio, mask, clip_eps)


def token_mean_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
) -> tuple[torch.Tensor, Stats]:
    """DAPO's token-level variant: every token of the batch weighs the same (long turns are not diluted)."""
    per_token, ratio = _clipped_surrogate(new_logprobs, old_logprobs, advantages, clip_eps)  # [N, T]
    return (per_token * mask).sum() / mask.sum().clamp(min=1), _stats(ratio, mask, clip_eps)


def reinforce_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
) -> tuple[torch.Tensor, Stats]:
    """The Selective Rollout reference's update: -(A * mean token log-prob), no ratio, no clipping."""
    mean_logp = (new_logprobs * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [N]
    ratio = torch.exp(new_logprobs - old_logprobs).detach()  # [N, T] for logging only
    return -(advantages * mean_logp).mean(), _stats(ratio, mask, clip_eps)


LOSSES = Registry(
    "losses",
    {
        "clipped_ratio": "learner.losses:clipped_ratio_loss",
        "token_mean": "learner.losses:token_mean_loss",
        "reinforce": "learner.losses:reinforce_loss",
    },
)
