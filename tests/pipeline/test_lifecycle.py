"""The group lifecycle: admit, run, count, hand to the allocator, refuse cut groups, send, wake itself."""

from dataclasses import dataclass

import trio
import trio.testing

from pipeline.allocation import SlotPool, StalenessPacer
from pipeline.counters import PhaseCounters
from pipeline.lifecycle import GroupLifecycle
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus


@dataclass
class _Admission:
    task_id: str
    size: int
    kind: str = "group"


class _Allocator:
    """Admits `groups` groups of 2; hands each finished group back, plus a forged cut copy (a bug)."""

    def __init__(self, groups):
        self.left = groups
        self.updates = []

    def next_admission(self, free_slots):
        if self.left == 0 or free_slots < 2:
            return None
        self.left -= 1
        return _Admission(f"t{self.left}", 2)

    def on_admitted(self, group_id, admission):
        pass

    def on_result(self, result):
        return [result, GroupResult(group_id=result.group_id, task_id=result.task_id, trajectories=[], cut=True)]

    def on_update(self, version):
        self.updates.append(version)


class _Rollout:
    """Each group takes one second; both trajectories win."""

    def __init__(self, lifecycle):
        self.lifecycle = lifecycle

    async def run_group(self, group_id, task_id, size, *, kind="group", parent=None):
        await trio.sleep(1.0)
        for _ in range(size):
            self.lifecycle.trajectory_finished()
        trajectories = [Trajectory(rollout_index=i, turns=[], reward=1.0, success=True, status=TrajectoryStatus.COMPLETE)
                        for i in range(size)]
        return GroupResult(group_id=group_id, task_id=task_id, trajectories=trajectories, cut=False, kind=kind)


class _Sink:
    def __init__(self):
        self.sent = []

    async def send(self, group):
        self.sent.append(group)


async def test_a_finished_group_is_counted_handed_on_and_a_cut_emission_refused(autojump_clock):
    counters, training = PhaseCounters(), _Sink()
    pacer = StalenessPacer(batch_groups=2, max_staleness=0)
    events, events_in = trio.open_memory_channel(100)
    allocator = _Allocator(groups=3)
    lifecycle = GroupLifecycle(allocator, SlotPool(4), pacer, counters, group_size=2, training=training, events=events)
    async with trio.open_nursery() as nursery:
        await nursery.start(lifecycle.run, _Rollout(lifecycle))
        assert lifecycle.groups_admitted == 2  # paced: 2 outstanding at most
        await trio.sleep(1.5)
        assert sorted(g.group_id for g in training.sent) == [0, 1]  # the forged cut copies never reach training
        assert counters.cut_emission_refused == 2 and counters.groups_finished == 2 and counters.successes == 4
        assert lifecycle.groups_admitted == 2 and pacer.backlog == 2  # waiting for the learner, not for slots
        lifecycle.learner_updated(1, groups_trained=2)
        await trio.testing.wait_all_tasks_blocked()
        assert lifecycle.groups_admitted == 3 and allocator.updates == [1]
        await trio.sleep(1.5)
        assert counters.merged_full_size == 3 and counters.merged_zero_variance == 3  # all won: zero variance
        nursery.cancel_scope.cancel()
    assert [type(m).__name__ for m in _drain(events_in)] == ["GroupResult"] * 3


def _drain(channel):
    out = []
    while True:
        try:
            out.append(channel.receive_nowait())
        except trio.WouldBlock:
            return out


async def test_the_groups_at_the_learner_are_those_sent_and_neither_trained_nor_dropped(autojump_clock):
    """What the phase reports as `GroupDropped(reason="run_ended")` when it ends: sent, not yet trained or dropped."""
    counters, training = PhaseCounters(), _Sink()
    pacer = StalenessPacer(batch_groups=2, max_staleness=1)
    events, _ = trio.open_memory_channel(100)
    lifecycle = GroupLifecycle(_Allocator(groups=3), SlotPool(6), pacer, counters, group_size=2, training=training, events=events)
    async with trio.open_nursery() as nursery:
        await nursery.start(lifecycle.run, _Rollout(lifecycle))
        await trio.sleep(1.5)
        assert list(lifecycle.at_learner) == [g.group_id for g in training.sent] and len(lifecycle.at_learner) == 3
        first, second, third = lifecycle.at_learner
        lifecycle.learner_dropped(second)
        lifecycle.learner_updated(1, groups_trained=1, group_ids=(third,))
        assert list(lifecycle.at_learner) == [first]
        nursery.cancel_scope.cancel()
