"""Each aggregation's weights: what every turn, token and trajectory weighs in one optimizer step."""

import pytest
import torch

from learner.aggregation import AGGREGATIONS, constant_normaliser, token_mean, trajectory_mean, turn_mean

# Trajectory 1: three turns of 2 tokens (a long failure); trajectory 2: one turn of 4 tokens.
LENGTHS = torch.tensor([2.0, 2.0, 2.0, 4.0], dtype=torch.float64)
TRAJ = torch.tensor([1, 1, 1, 2])


def _per_trajectory(weights):
    tokens = weights * LENGTHS
    return [float(tokens[:3].sum()), float(tokens[3])]


def test_turn_mean_gives_each_turn_the_same_weight_so_long_trajectories_dominate():
    w = turn_mean(LENGTHS, TRAJ, constant=1.0)
    assert (w * LENGTHS).tolist() == pytest.approx([0.25] * 4)
    assert _per_trajectory(w) == pytest.approx([0.75, 0.25])


def test_trajectory_mean_gives_each_trajectory_the_same_weight():
    w = trajectory_mean(LENGTHS, TRAJ, constant=1.0)
    assert _per_trajectory(w) == pytest.approx([0.5, 0.5])
    assert float((w * LENGTHS).sum()) == pytest.approx(1.0)


def test_token_mean_gives_each_token_the_same_weight():
    w = token_mean(LENGTHS, TRAJ, constant=1.0)
    assert w.tolist() == pytest.approx([0.1] * 4)


def test_constant_normaliser_divides_token_sums_by_a_constant_per_trajectory():
    w = constant_normaliser(LENGTHS, TRAJ, constant=8.0)
    assert _per_trajectory(w) == pytest.approx([6 / 16, 4 / 16])


def test_all_are_registered():
    assert set(AGGREGATIONS.names()) >= {"turn_mean", "trajectory_mean", "token_mean", "constant"}
