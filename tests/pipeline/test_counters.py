"""The phase's counters: complete groups by kind, overall and per task family; cut groups count as cut only."""

from types import SimpleNamespace

from pipeline.counters import LearnerReport, PhaseCounters
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus
from pipeline.run.resume import capture_counters, restore_counters
from pipeline.run.summary import group_kinds_table


def _group(task_id: str, wins: list[bool], *, cut: bool = False) -> GroupResult:
    status = TrajectoryStatus.CUT if cut else TrajectoryStatus.COMPLETE
    trajectories = [Trajectory(rollout_index=i, turns=[], reward=float(w), success=w, status=status) for i, w in enumerate(wins)]
    return GroupResult(group_id=0, task_id=task_id, trajectories=trajectories, cut=cut)


def _counted() -> PhaseCounters:
    counters = PhaseCounters(family_of={"a": "pick_clean", "b": "pick_clean", "c": "look_at"})
    for task_id, wins in [("a", [False, False]), ("b", [True, False]), ("a", [True, True]), ("c", [False, False]),
                          ("unknown", [True, False])]:
        counters.group_finished(_group(task_id, wins))
    counters.group_finished(_group("c", [True, True], cut=True))
    return counters


def test_complete_groups_are_counted_by_kind_within_their_task_family():
    counters = _counted()
    assert counters.kinds_by_family == {
        "pick_clean": {"all_fail": 1, "mixed": 1, "all_succeed": 1},
        "look_at": {"all_fail": 1, "mixed": 0, "all_succeed": 0},  # the cut group is not a kind
    }
    # a task outside the map still counts overall
    assert (counters.all_fail_complete, counters.all_succeed_complete, counters.groups_complete) == (2, 1, 5)
    assert group_kinds_table(counters.kinds_by_family).splitlines()[2:] == [
        "| look_at | 1 | 0 | 0 |", "| pick_clean | 1 | 1 | 1 |"]


def test_the_family_breakdown_survives_a_checkpoint():
    counters = _counted()
    rollout = SimpleNamespace(env_steps=0, trajectories_failed=0, trajectories_ended=0, trajectory_seconds=0.0, cuts_late=0,
                              first_error="", cancels_received=0, shadow_cancels=0)
    admission = SimpleNamespace(state_dict=lambda: {}, load_state_dict=lambda state: None)
    state = capture_counters(counters=counters, admission=admission, rollout=rollout, version=3, gate=None, wall_s=1.0)
    counters.group_finished(_group("c", [True, False]))  # after the checkpoint: not in it
    back = PhaseCounters(family_of=counters.family_of)
    assert restore_counters(state, counters=back, admission=admission, rollout=rollout, gate=None) == 3
    assert back.kinds_by_family["look_at"] == {"all_fail": 1, "mixed": 0, "all_succeed": 0}
    assert back.kinds_by_family == _counted().kinds_by_family


def test_what_held_the_loop_survives_a_checkpoint():
    counters = PhaseCounters()
    counters.loop_blocks["rollout"] = [2, 0.006, 0.004]
    rollout = SimpleNamespace(env_steps=0, trajectories_failed=0, trajectories_ended=0, trajectory_seconds=0.0, cuts_late=0,
                              first_error="", cancels_received=0, shadow_cancels=0)
    admission = SimpleNamespace(state_dict=lambda: {}, load_state_dict=lambda state: None)
    state = capture_counters(counters=counters, admission=admission, rollout=rollout, version=3, gate=None, wall_s=1.0)
    counters.loop_blocks["rollout"][0] += 1  # after the checkpoint: not in it
    back = PhaseCounters()
    restore_counters(state, counters=back, admission=admission, rollout=rollout, gate=None)
    assert back.loop_blocks == {"rollout": [2, 0.006, 0.004]}


def test_learner_item_counts_add_up_over_updates_and_survive_a_checkpoint():
    counters = PhaseCounters()
    for beyond in (7, 0, 3):
        stats = {"learner/items": 5.0, "learner/items_beyond_max": float(beyond), "learner/items_dropped_stale": 1.0}
        counters.learner_updated(LearnerReport(version=1, stats=stats, train_seconds=0.1, weights={}, trainer_state=None,
                                               groups_trained=2))
    assert (counters.items_trained, counters.items_beyond_max, counters.items_dropped_stale) == (15, 10, 3)
    rollout = SimpleNamespace(env_steps=0, trajectories_failed=0, trajectories_ended=0, trajectory_seconds=0.0, cuts_late=0,
                              first_error="", cancels_received=0, shadow_cancels=0)
    admission = SimpleNamespace(state_dict=lambda: {}, load_state_dict=lambda state: None)
    state = capture_counters(counters=counters, admission=admission, rollout=rollout, version=3, gate=None, wall_s=1.0)
    back = PhaseCounters()
    restore_counters(state, counters=back, admission=admission, rollout=rollout, gate=None)
    assert back.items_beyond_max == 10
