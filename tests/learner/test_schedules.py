"""Learning-rate schedules: their values, their ends, and the lr each update really runs at."""

import math

import pytest
import torch

from learner.losses import clipped_ratio_loss
from learner.schedules import LR_SCHEDULES, cosine, linear, lr_factor
from learner.trainer import Trainer
from pipeline.config import LearnerSection

from .test_trainer import _group
from .toy_model import BigramModel


@pytest.mark.parametrize("schedule", [linear, cosine])
def test_a_decaying_schedule_starts_at_the_full_lr_and_ends_at_the_floor(schedule):
    assert schedule(0.0, floor=0.1) == pytest.approx(1.0)
    assert schedule(1.0, floor=0.1) == pytest.approx(0.1)
    assert schedule(1.7, floor=0.1) == pytest.approx(0.1)  # past the horizon: held at the floor
    assert schedule(-0.5, floor=0.1) == pytest.approx(1.0)
    values = [schedule(p / 10, floor=0.1) for p in range(11)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))  # strictly decreasing on the way


def test_known_values():
    assert linear(0.25, floor=0.2) == pytest.approx(0.8)  # 1 - 0.8 x 0.25
    assert cosine(0.5, floor=0.2) == pytest.approx(0.6)  # halfway between 1 and the floor
    assert cosine(0.25, floor=0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_factor("constant", 7, 10, 0.1) == 1.0
    assert lr_factor("linear", 5, 10, 0.0) == pytest.approx(0.5)
    assert lr_factor("linear", 3, 0, 0.5) == pytest.approx(0.5)  # a zero horizon is the end of the schedule


def test_the_builtins_are_registered_and_an_unknown_name_is_a_problem():
    assert {"constant", "linear", "cosine"} <= set(LR_SCHEDULES.names())
    assert LR_SCHEDULES.check("linear", "learner.lr_schedule") == []
    assert LR_SCHEDULES.check("stepwise", "learner.lr_schedule")


def test_the_update_runs_at_the_scheduled_lr():
    """Learner version 2 of 4 on a linear schedule to 0.5 trains exactly as a constant lr of 0.75 x lr."""
    start = BigramModel().state_dict()
    scheduled_model, constant_model = BigramModel(), BigramModel()
    scheduled_model.load_state_dict(start)
    constant_model.load_state_dict(start)
    scheduled = Trainer(
        scheduled_model, LearnerSection(lr=0.04, max_items=0, lr_schedule="linear", lr_floor=0.5),
        clipped_ratio_loss, total_updates=4,
    )
    constant = Trainer(constant_model, LearnerSection(lr=0.03, max_items=0), clipped_ratio_loss)
    batch = [_group(scheduled_model, 0, [1.0, 0.0, 0.0, 1.0], version=2)]
    weights, stats = scheduled.update(batch, version=2)
    reference, reference_stats = constant.update(batch, version=2)
    assert stats["learner/lr"] == pytest.approx(0.03)
    assert reference_stats["learner/lr"] == pytest.approx(0.03)
    assert not torch.equal(weights["table.weight"], start["table.weight"])
    torch.testing.assert_close(weights["table.weight"], reference["table.weight"])
