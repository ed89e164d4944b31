"""Group-relative advantages (GRPO, Shao et al. 2024), as small pure functions.

A(i) = (r_i - mean(r)) / (std(r) + eps) over the G rollouts of one prompt, with the population std
(ddof=0) as in the Selective Rollout reference (`scripts/19_grpo_onpolicy.py:79`). Computed in float64;
a group whose rewards are all equal gets exactly zero advantages (not float round-off).
"""

from __future__ import annotations

import torch

from pipeline.outcomes import is_zero_variance as is_zero_variance


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean) / (std + eps) within one group.

    Args:
        rewards: [G] rewards of one group.
    Returns:
        [G] float64 advantages; exactly zero for a zero-variance group.
    """
    rewards = rewards.to(torch.float64)  # [G]
    if rewards.numel() == 0 or bool((rewards == rewards[0]).all()):
        return torch.zeros_like(rewards)
    mean = rewards.mean()  # []
    std = rewards.std(correction=0)  # [] population std
    return (rewards - mean) / (std + eps)  # [G]
