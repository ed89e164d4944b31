"""Training items from finished groups: who is left out, how advantages are weighted, the prompt shuffle."""

import random

import pytest

from learner.items import TrainItem, build_items, shuffled_by_prompt
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus, Turn

from .toy_model import BigramModel
from .toy_model import toy_group as _group


def _turn(anchor: str, reward: float = 0.0) -> Turn:
    return Turn(prompt_ids=[1, 2], token_ids=[3], logprobs=[-1.0], action="a", policy_version=0, reward=reward, anchor=anchor)


def test_items_skip_failed_trajectories_and_zero_advantage():
    model = BigramModel()
    groups = [
        _group(model, 0, [1.0, 0.0, 0.0, 0.0]),
        _group(model, 1, [1.0, 1.0, 1.0]),  # zero variance: no items
        _group(model, 2, [1.0, 0.0, 0.0], statuses={1: TrajectoryStatus.ERROR, 2: TrajectoryStatus.ERROR}),
    ]
    items, counts = build_items(groups, eps=1e-6)
    assert counts.zero_advantage == 3  # the zero-variance group's three turns carry no gradient
    assert len(items) == 4  # group 0 only; group 2 has a single usable trajectory
    assert sum(it.advantage for it in items) == pytest.approx(0.0, abs=1e-5)


def test_a_cut_group_is_refused():
    model = BigramModel()
    with pytest.raises(ValueError, match="cut"):
        build_items([_group(model, 5, [1.0, 0.0], cut=True)], eps=1e-6)


def test_zero_advantage_items_are_kept_only_when_asked():
    model = BigramModel()
    groups = [_group(model, 0, [1.0, 0.0]), _group(model, 1, [1.0, 1.0])]
    assert len(build_items(groups, eps=1e-6)[0]) == 2
    items, _ = build_items(groups, eps=1e-6, keep_zero_advantage=True)
    assert len(items) == 4 and sorted(it.advantage for it in items)[1:3] == [0.0, 0.0]


def test_negative_weight_scales_failures_down_to_positive_sample_reinforcement():
    model = BigramModel()
    groups = [_group(model, 0, [1.0, 0.0, 0.0, 0.0])]
    full, _ = build_items(groups, eps=1e-6)
    half, _ = build_items(groups, eps=1e-6, negative_weight=0.5)
    assert [h.advantage for h in half] == pytest.approx([f.advantage * (0.5 if f.advantage < 0 else 1) for f in full])
    positive, counts = build_items(groups, eps=1e-6, negative_weight=0.0)
    assert [it.advantage for it in positive] == pytest.approx([full[0].advantage]) and full[0].advantage > 0
    assert counts.zero_advantage == 3  # the failures' turns are left out, as zero-advantage turns are


def test_step_weight_adds_gigpo_step_advantages_to_each_turn():
    # Two rollouts of one task: both start in state "s0"; the first walks on ("x") and wins, the second takes
    # a wrong turn ("y") and loses. Only "s0" is shared, so only those two turns get a step-level term.
    won = Trajectory(rollout_index=0, turns=[_turn("s0"), _turn("x", 1.0)], reward=1.0, success=True,
                     status=TrajectoryStatus.COMPLETE)
    lost = Trajectory(rollout_index=1, turns=[_turn("s0"), _turn("y"), _turn("z")], reward=0.0, success=False,
                      status=TrajectoryStatus.COMPLETE)
    group = GroupResult(group_id=0, task_id="t", trajectories=[won, lost], cut=False)
    grpo, _ = build_items([group], eps=0.0)
    assert [it.advantage for it in grpo] == [1.0, 1.0, -1.0, -1.0, -1.0]
    gigpo, counts = build_items([group], eps=0.0, step_weight=0.5, gamma=0.9)
    assert [it.advantage for it in gigpo] == pytest.approx([1.5, 1.0, -1.5, -1.0, -1.0])
    assert counts.step_signal == 2 and counts.turns == 5
    assert [it.trajectory for it in gigpo] == [1, 1, 2, 2, 2]


def test_step_advantages_train_an_all_succeed_group_towards_its_shorter_path():
    # Equal outcomes give no episode-level signal; from the shared start the faster winner scores higher.
    fast = Trajectory(rollout_index=0, turns=[_turn("s0"), _turn("x", 1.0)], reward=1.0, success=True,
                      status=TrajectoryStatus.COMPLETE)
    slow = Trajectory(rollout_index=1, turns=[_turn("s0"), _turn("y"), _turn("z", 1.0)], reward=1.0, success=True,
                      status=TrajectoryStatus.COMPLETE)
    group = GroupResult(group_id=0, task_id="t", trajectories=[fast, slow], cut=False)
    assert build_items([group], eps=0.0)[0] == []
    items, _ = build_items([group], eps=0.0, step_weight=1.0, gamma=0.9)
    assert [(it.trajectory, it.advantage) for it in items] == [(1, pytest.approx(1.0)), (2, pytest.approx(-1.0))]


def test_the_shuffle_keeps_turns_with_one_prompt_together():
    prompts = [[1], [2], [1], [3], [2], [1]]
    items = [TrainItem(p, [i], [0.0], 1.0, i, 0) for i, p in enumerate(prompts)]
    orders = set()
    for seed in range(20):
        order = shuffled_by_prompt(items, random.Random(seed))
        assert sorted(it.trajectory for it in order) == list(range(6))  # a permutation
        runs = [it.prompt_ids[0] for it in order]
        assert sum(a != b for a, b in zip(runs, runs[1:], strict=False)) == 2  # three prompts, three blocks
        orders.add(tuple(runs))
    assert len(orders) == 6  # every order of the three prompts occurs
