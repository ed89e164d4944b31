"""Group-relative advantages (GRPO, Shao et al. 2024), as small pure functions.

A(i) = (r_i - mean(r)) / (std(r) + eps) over the G rollouts of one prompt, with the population std
(ddof=0) as in the Selective Rollout reference (`scripts/19_grpo_onpolicy.py:79`). Computed in float64;
a group whose rewards are all equal gets exactly zero advantages (not float round-off).

Step level (GiGPO, `learner.step_weight` > 0): one outcome per 10-30-step trajectory tells a turn only
whether its whole trajectory beat the group. Rollouts of one task often pass through the same state (the
same observation and commands); comparing the discounted returns of the actions taken from such an
*anchor state* says which of them was better there: taking the wrong object against walking on, going
back to a receptacle already searched against a new one. A turn's advantage is then
A_episode(trajectory) + step_weight * A_step(turn).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

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


def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """R_t = sum_k gamma^k r_{t+k}: the return of each step of one trajectory.

    Args:
        rewards: [T] per-step rewards.
    Returns:
        [T] float64 discounted returns.
    """
    returns = torch.zeros(rewards.numel(), dtype=torch.float64)  # [T]
    running = 0.0
    for t in range(rewards.numel() - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        returns[t] = running
    return returns


def step_advantages(anchors: Sequence[Sequence[str]], returns: Sequence[torch.Tensor], eps: float = 1e-6) -> list[torch.Tensor]:
    """GiGPO's step-level advantages (Feng et al. 2025, arXiv 2505.10978) within one group.

    Every step of every trajectory whose anchor (the state it acted in) occurs at least twice in the group
    is normalised against the other steps from that state: (R - mean) / (std + eps) over the anchor's
    steps, population std, float64. A step from a state no other step shares, or from one whose returns are
    all equal, gets exactly 0. An anchor "" means unknown and is never grouped.

    Args:
        anchors: per trajectory, [T_i] the anchor of each step.
        returns: per trajectory, [T_i] discounted returns (`discounted_returns`).
    Returns:
        per trajectory, [T_i] float64 step advantages.
    """
    members: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, trajectory in enumerate(anchors):
        for t, anchor in enumerate(trajectory):
            if anchor:
                members[anchor].append((i, t))
    out = [torch.zeros(len(trajectory), dtype=torch.float64) for trajectory in anchors]  # per trajectory [T_i]
    for steps in members.values():
        if len(steps) < 2:
            continue
        values = torch.stack([returns[i][t] for i, t in steps]).to(torch.float64)  # [M]
        for (i, t), advantage in zip(steps, group_advantages(values, eps).tolist(), strict=True):
            out[i][t] = advantage
    return out
