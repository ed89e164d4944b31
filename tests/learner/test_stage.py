"""The learner stage is message-driven: groups in over its socket, reports out over a channel; it never
calls into the runtime, it accepts only announced groups, and it starts no update past the run's last one."""

import contextlib
import threading
from pathlib import Path

import trio

from learner.stage import LearnerStage
from pipeline.config import LearnerSection, TransportSection
from pipeline.counters import ZERO_VARIANCE_TRAINED, GroupsConsumed, LearnerReport, PhaseCounters
from pipeline.messages import GroupExpected, GroupResult, Trajectory, TrajectoryStatus
from pipeline.profiling import Profiler
from pipeline.stage import StageContext
from pipeline.transport import open_context


class _Trainer:
    def __init__(self):
        self.batches = []

    def update(self, groups, *, version=0):
        self.batches.append([g.group_id for g in groups])
        return {"w": version + 1}, {"learner/loss": 0.5}

    def state_dict(self):
        return {"batches": len(self.batches)}

    def stop(self):
        pass


def _group(gid, rewards):
    trajectories = [Trajectory(rollout_index=i, turns=[], reward=r, success=r > 0, status=TrajectoryStatus.COMPLETE)
                    for i, r in enumerate(rewards)]
    return GroupResult(group_id=gid, task_id="t", trajectories=trajectories, cut=False)


@contextlib.asynccontextmanager
async def _serving(stage, name):
    """`stage` running on a results socket of its own; yields a PUSH socket to it, and cancels the stage on exit
    (after the socket closed)."""
    t = TransportSection(results=f"inproc://learner-test-{name}")
    async with open_context() as zmq, trio.open_nursery() as nursery:
        await nursery.start(stage.run, StageContext(zmq=zmq, addresses=t, run_dir=Path("."), profiler=Profiler(enabled=False)))
        push = zmq.socket("push", t.results, bind=False)
        async with push:
            yield push
        nursery.cancel_scope.cancel()


async def _announce(push, gid, rewards):
    """Send group `gid` as the runtime does across processes: announced, then the group."""
    await push.send(GroupExpected(group_id=gid))
    await push.send(_group(gid, rewards))


async def test_reports_an_update_per_batch_and_a_drop_per_zero_variance_group():
    reports, received = trio.open_memory_channel(10)
    trainer = _Trainer()
    stage = LearnerStage(trainer, LearnerSection(batch_groups=2), reports=reports, version=3, announced_on_socket=True)
    async with _serving(stage, "updates") as push:
        await push.send(_group(9, [1.0, 0.0]))  # never announced: dropped
        for gid, rewards in ((0, [1.0, 0.0]), (1, [1.0, 1.0]), (2, [0.0, 1.0])):
            await _announce(push, gid, rewards)
        dropped = await received.receive()
        report = await received.receive()
    assert dropped == GroupsConsumed(zero_variance=True, group_id=1, reason="all_succeed")
    assert isinstance(report, LearnerReport) and report.version == 4 and report.groups_trained == 2
    assert report.group_ids == (0, 2)
    assert report.weights == {"w": 4} and report.trainer_state == {"batches": 1} and trainer.batches == [[0, 2]]


async def test_each_report_counts_the_zero_variance_groups_it_trained():
    reports, received = trio.open_memory_channel(10)
    stage = LearnerStage(_Trainer(), LearnerSection(batch_groups=3, drop_zero_variance=False), reports=reports,
                         announced_on_socket=True)
    async with _serving(stage, "kept") as push:
        for gid, rewards in ((0, [1.0, 0.0]), (1, [1.0, 1.0]), (2, [0.0, 0.0]), (3, [0.0, 1.0])):
            await _announce(push, gid, rewards)
        report = await received.receive()  # groups 0-2; group 3 waits for a batch that never fills
    assert report.groups_trained == 3 and report.stats[ZERO_VARIANCE_TRAINED] == 2.0
    counters = PhaseCounters()
    counters.learner_updated(report)
    assert (counters.groups_trained, counters.groups_trained_zero_variance) == (3, 2)


async def test_no_update_starts_past_the_runs_last_version():
    """The runtime ends the phase on the last update's report: an update started after it (minutes on a real
    LM) would delay the end and publish nothing. Groups that arrive after it are consumed as "run_ended"."""
    reports, received = trio.open_memory_channel(10)
    trainer = _Trainer()
    stage = LearnerStage(trainer, LearnerSection(batch_groups=1), reports=reports, version=3, last_version=4,
                         announced_on_socket=True)
    async with _serving(stage, "last") as push:
        for gid in (0, 1, 2):
            await _announce(push, gid, [1.0, 0.0])
        messages = [await received.receive() for _ in range(3)]
    assert isinstance(messages[0], LearnerReport) and messages[0].version == 4
    assert messages[1:] == [GroupsConsumed(group_id=1, reason="run_ended"), GroupsConsumed(group_id=2, reason="run_ended")]
    assert trainer.batches == [[0]] and stage.version == 4


class _BlockedTrainer(_Trainer):
    """An update that runs until the test releases it (the update's worker thread waits on an event)."""

    def __init__(self):
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def update(self, groups, *, version=0):
        self.started.set()
        self.release.wait()
        return super().update(groups, version=version)

    def stop(self):
        self.stopped = True
        self.release.set()  # a real trainer raises UpdateStopped at its next micro-batch; this one ends its wait


async def test_a_stage_cancelled_during_an_update_tells_the_trainer_to_stop_and_waits_for_it():
    """On a real LM an update runs for minutes: the phase's end (or Ctrl-C) stops it at its next micro-batch
    instead of waiting for all of it, and the stage still returns only once the update's thread has."""
    reports, received = trio.open_memory_channel(10)
    trainer = _BlockedTrainer()
    stage = LearnerStage(trainer, LearnerSection(batch_groups=1), reports=reports, announced_on_socket=True)
    async with _serving(stage, "stop") as push:
        await _announce(push, 0, [1.0, 0.0])
        await trio.to_thread.run_sync(trainer.started.wait)  # blocked until the stage's cancellation calls `stop`
    assert trainer.stopped and trainer.batches == [[0]]  # the update returned before the stage did
    assert stage.version == 0 and received.statistics().current_buffer_used == 0  # nothing published


async def test_a_zero_variance_group_is_dropped_while_an_update_runs_not_after_it():
    """The runtime's staleness pacing counts a group as outstanding until the learner consumes it: a drop
    that waited for a 25-s update kept slots idle (half of the learn preset's groups are zero-variance)."""
    reports, received = trio.open_memory_channel(10)
    trainer = _BlockedTrainer()
    stage = LearnerStage(trainer, LearnerSection(batch_groups=1), reports=reports, announced_on_socket=True)
    async with _serving(stage, "busy") as push:
        for gid, rewards in ((0, [1.0, 0.0]), (1, [0.0, 0.0])):
            await _announce(push, gid, rewards)
        await trio.to_thread.run_sync(trainer.started.wait)
        try:
            with trio.fail_after(30):  # a hang guard only: the drop arrives while the update is still blocked
                dropped = await received.receive()
        finally:
            trainer.release.set()  # let the update end, whether the drop came or not
        report = await received.receive()
    assert dropped == GroupsConsumed(zero_variance=True, group_id=1, reason="all_fail")
    assert isinstance(report, LearnerReport) and trainer.batches == [[0]]


def test_each_update_gives_the_freed_memory_back_unless_told_not_to(monkeypatch):
    # An update's activations are hundreds of MB, and every worker thread it lands on keeps its own malloc arena
    # at its high-water mark: the run's RSS grew by that per thread (issue 60, item 13).
    trims = []
    monkeypatch.setattr("pipeline.memory.trim", lambda: trims.append(threading.get_ident()) or True)
    groups = [_group(0, [1.0, 0.0])]
    for trim, expected in ((True, 1), (False, 0)):
        trims.clear()
        stage = LearnerStage(_Trainer(), LearnerSection(batch_groups=1, trim_memory=trim), reports=None)  # type: ignore[arg-type]
        weights, _, _ = stage._update(groups, 0, Profiler(enabled=False))
        assert weights == {"w": 1} and len(trims) == expected
