"""Merged prompt outcomes: labels of a prompt's rollout groups together, bounded memory."""

from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus
from pipeline.outcomes import MergedOutcomes, is_zero_variance, label_rewards, zero_variance_label


def test_a_plain_group_settles_at_once_and_an_extendable_one_waits_for_its_children():
    settled = []
    merged = MergedOutcomes(on_settled=lambda rewards, data: settled.append((rewards, data)))
    merged.open_root(1, "group", "a")
    merged.add(1, [0.0, 1.0])
    assert settled == [([0.0, 1.0], "a")]
    merged.open_root(2, "pilot", "b")
    merged.add(2, [0.0, 0.0])
    assert merged.open_child(3, parent=2)
    merged.add(3, [1.0])
    assert len(settled) == 1
    merged.flush()
    assert settled[-1] == ([0.0, 0.0, 1.0], "b")


def test_memory_is_bounded_by_the_window():
    settled = []
    merged = MergedOutcomes(on_settled=lambda rewards, data: settled.append(rewards), window=4)
    for gid in range(10):
        merged.open_root(gid, "pilot")
        merged.add(gid, [float(gid)])
    assert len(merged._roots) == 4 and len(merged._root_of) == 4
    assert settled == [[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]]
    assert not merged.open_child(99, parent=0)  # a settled prompt cannot be extended


def test_a_discarded_root_is_never_settled():
    settled = []
    merged = MergedOutcomes(on_settled=lambda rewards, data: settled.append(rewards))
    merged.open_root(1, "pilot")
    merged.discard(1)
    merged.flush()
    assert settled == []


def test_label_rewards_leave_cut_and_failed_rollouts_out():
    def traj(i, reward, status):
        return Trajectory(rollout_index=i, turns=[], reward=reward, success=reward > 0, status=status)

    result = GroupResult(group_id=1, task_id="t", cut=False, trajectories=[
        traj(0, 0.0, TrajectoryStatus.COMPLETE), traj(1, 1.0, TrajectoryStatus.ERROR), traj(2, 0.0, TrajectoryStatus.COMPLETE),
    ])
    assert label_rewards(result) == [0.0, 0.0]
    assert is_zero_variance(label_rewards(result))


def test_zero_variance_label_needs_two_complete_rewards():
    assert zero_variance_label([0.0, 0.0]) is True and zero_variance_label([0.0, 1.0]) is False
    assert zero_variance_label([1.0]) is None and zero_variance_label([]) is None


def test_drop_reason_names_the_outcome_of_a_group_the_learner_drops():
    from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus
    from pipeline.outcomes import DROP_REASONS, drop_reason

    def group(wins, *, cut=False, reward=None):
        trajectories = [Trajectory(rollout_index=i, turns=[], reward=float(w) if reward is None else reward, success=w,
                                   status=TrajectoryStatus.COMPLETE) for i, w in enumerate(wins)]
        return GroupResult(group_id=0, task_id="t", trajectories=trajectories, cut=cut)

    assert drop_reason(group([False, False])) == "all_fail"
    assert drop_reason(group([True, True])) == "all_succeed"
    assert drop_reason(group([True, False], reward=0.5)) == "zero_variance"  # equal rewards, mixed outcomes
    assert drop_reason(group([True, False], cut=True)) == "cut"
    assert {"all_fail", "all_succeed", "zero_variance", "cut", "run_ended"} == set(DROP_REASONS)
