"""The GRPO update on a fixed batch: items are built right, loss goes down, parameters move."""

import pytest
import torch

from learner.losses import clipped_ratio_loss
from learner.trainer import Trainer, build_items
from pipeline.config import LearnerSection
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus, Turn

from .toy_model import BigramModel


def _group(model, gid, rewards, completion=(3, 4, 5), cut=False, statuses=None):
    with torch.no_grad():
        old, _ = model.completion_logprobs([[1, 2]], [list(completion)])
    trajectories = [
        Trajectory(
            rollout_index=i,
            turns=[Turn(prompt_ids=[1, 2], token_ids=list(completion) if r > 0 else [6, 7],
                        logprobs=old[0].tolist() if r > 0 else [-2.7, -2.7], action="a", policy_version=0)],
            reward=r,
            success=r > 0,
            status=(statuses or {}).get(i, TrajectoryStatus.COMPLETE),
        )
        for i, r in enumerate(rewards)
    ]
    return GroupResult(group_id=gid, task_id="t", trajectories=trajectories, cut=cut)


def test_items_skip_failed_trajectories_and_zero_advantage():
    model = BigramModel()
    groups = [
        _group(model, 0, [1.0, 0.0, 0.0, 0.0]),
        _group(model, 1, [1.0, 1.0, 1.0]),  # zero variance: no items
        _group(model, 2, [1.0, 0.0, 0.0], statuses={1: TrajectoryStatus.ERROR, 2: TrajectoryStatus.ERROR}),
    ]
    items = build_items(groups, eps=1e-6)
    assert len(items) == 4  # group 0 only; group 2 has a single usable trajectory
    assert sum(it.advantage for it in items) == pytest.approx(0.0, abs=1e-5)


def test_a_cut_group_is_refused():
    model = BigramModel()
    with pytest.raises(ValueError, match="cut"):
        build_items([_group(model, 5, [1.0, 0.0], cut=True)], eps=1e-6)


def test_updates_lower_the_loss_and_change_the_parameters():
    model = BigramModel()
    cfg = LearnerSection(lr=0.05, max_items=0, micro_batch=3)
    trainer = Trainer(model, cfg, clipped_ratio_loss)
    batch = [_group(model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    losses = []
    for _ in range(5):
        state, stats = trainer.update(batch)
        losses.append(stats["learner/loss"])
    assert losses[-1] < losses[0]
    assert any(not torch.equal(before[k], state[k]) for k in before)
    # the winning completion became more likely
    with torch.no_grad():
        now, _ = model.completion_logprobs([[1, 2]], [[3, 4, 5]])
    assert float(now.sum()) > float(sum(batch[0].trajectories[0].turns[0].logprobs))


def test_published_state_is_a_detached_copy():
    model = BigramModel()
    trainer = Trainer(model, LearnerSection(lr=0.05), clipped_ratio_loss)
    state, _ = trainer.update([_group(model, 0, [1.0, 0.0])])
    trainer.update([_group(model, 1, [1.0, 0.0])])
    assert not torch.equal(state["table.weight"], model.state_dict()["table.weight"])
