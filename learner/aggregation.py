"""How per-token loss terms become one scalar: one registered weighting per convention.

Every aggregation has the signature

    aggregation(lengths [N], trajectories [N], *, constant) -> weights [N]

where item i (one policy turn) has `lengths[i]` completion tokens and belongs to trajectory
`trajectories[i]` (ids unique within the batch). The loss is sum_i weights[i] * sum_t term[i, t]: the
trainer computes the weights once over all of an update's items and slices them per mini-batch (scaled
by the number of mini-batches), so neither micro-batching nor mini-batching changes them: a trajectory
whose turns spread over several optimizer steps weighs in total what it weighs in one.

Why it matters in multi-turn GRPO: with one item per turn, a 30-step failure carries ~4x the weight of a
7-step success under `turn_mean`, so an update is dominated by pushing failure actions down (a known path
to collapse). `trajectory_mean` gives every trajectory the same total weight.
"""

from __future__ import annotations

import torch

from pipeline.registry import Registry


def turn_mean(lengths: torch.Tensor, trajectories: torch.Tensor, *, constant: float) -> torch.Tensor:
    """Token mean within each turn, then mean over turns (every turn weighs the same)."""
    return 1.0 / (lengths.clamp(min=1) * len(lengths))  # [N]


def token_mean(lengths: torch.Tensor, trajectories: torch.Tensor, *, constant: float) -> torch.Tensor:
    """DAPO's token-level mean over the whole step (every token weighs the same)."""
    return torch.full_like(lengths, 1.0 / max(float(lengths.sum()), 1.0), dtype=torch.float64)  # [N]


def trajectory_mean(lengths: torch.Tensor, trajectories: torch.Tensor, *, constant: float) -> torch.Tensor:
    """Token mean within each turn, turn mean within each trajectory, mean over trajectories."""
    _, inverse, turns = trajectories.unique(return_inverse=True, return_counts=True)  # [J], [N], [J]
    return 1.0 / (lengths.clamp(min=1) * turns[inverse] * len(turns))  # [N]


def constant_normaliser(lengths: torch.Tensor, trajectories: torch.Tensor, *, constant: float) -> torch.Tensor:
    """Dr. GRPO: token sum per trajectory divided by a constant, mean over trajectories (no length bias
    from per-sequence normalisation; longer trajectories carry proportionally more tokens)."""
    n_traj = len(trajectories.unique())
    return torch.full_like(lengths, 1.0 / (constant * n_traj), dtype=torch.float64)  # [N]


AGGREGATIONS = Registry(
    "aggregations",
    {
        "turn_mean": "learner.aggregation:turn_mean",
        "token_mean": "learner.aggregation:token_mean",
        "trajectory_mean": "learner.aggregation:trajectory_mean",
        "constant": "learner.aggregation:constant_normaliser",
    },
)
