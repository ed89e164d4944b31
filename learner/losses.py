"""Policy-gradient token losses, one registered function per variant (no string switches in the hot path).

Every loss has the signature

    loss_fn(new_logprobs [N, T], old_logprobs [N, T], advantages [N], mask [N, T], *, clip_eps) -> [N, T]

and returns the per-token loss terms (0 on padding). N counts training items (one policy turn of one
trajectory each) and T the longest completion. How the terms are weighted into one scalar (per turn,
per trajectory, per token, a constant) is the aggregation's job (`learner.aggregation`), so a loss never
decides the normaliser and micro-batching never changes it.

Log-probs are those of the rollouts' sampling distribution (`stages.policy.sampling`): the ratio
exp(new - old) is pi_theta / mu for the temperature-scaled, top-p distribution that produced the data.
"""

from __future__ import annotations

import torch

from pipeline.registry import Registry


def clipped_ratio_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
) -> torch.Tensor:
    """GRPO / PPO's clipped importance-ratio surrogate, -min(r A, clip(r, 1 - eps, 1 + eps) A), per token."""
    ratio = torch.exp(new_logprobs - old_logprobs)  # [N, T]
    adv = advantages[:, None].to(ratio.dtype)  # [N, 1]
    unclipped = ratio * adv  # [N, T]
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv  # [N, T]
    return -torch.minimum(unclipped, clipped) * mask  # [N, T]


def reinforce_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
) -> torch.Tensor:
    """The Selective Rollout reference's update, -A log pi per token: no ratio, no clipping (with the
    `turn_mean` aggregation it is the reference's -(A * mean token log-prob) per step item)."""
    return -advantages[:, None].to(new_logprobs.dtype) * new_logprobs * mask  # [N, T]


LOSSES = Registry(
    "losses",
    {
        "clipped_ratio": "learner.losses:clipped_ratio_loss",
        "reinforce": "learner.losses:reinforce_loss",
    },
)
