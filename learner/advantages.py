"""Group-relative advantages (GRPO, Shao et al. 2024), as small pure functions.

A(i) = (r_i - mean(r)) / (std(r) + eps) over the G rollouts of one prompt, with the population std
(ddof=0) as in the Selective Rollout reference (`scripts/19_grpo_onpolicy.py:79`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean) / (std + eps) within one group.

    Args:
        rewards: [G] rewards of one group.
    Returns:
        [G] advantages; all zero for a zero-variance group.
    """
    mean = rewards.mean()  # []
    std = rewards.std(correction=0)  # [] population std
    return (rewards - mean) / (std + eps)  # [G]


def is_zero_variance(rewards: Sequence[float]) -> bool:
    """Every rollout got the same reward: the group carries no GRPO gradient."""
    return len(rewards) == 0 or max(rewards) == min(rewards)
