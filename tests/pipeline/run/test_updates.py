"""The report consumer's starvation warning: a learner that drops group after group as zero-variance says so."""

from types import SimpleNamespace

import trio
from structlog.testing import capture_logs

from pipeline.config import RunConfig
from pipeline.counters import GroupsConsumed, PhaseCounters
from pipeline.messages import GroupDropped
from pipeline.run.updates import STARVED_BATCHES, Starvation, UpdateRecorder, starved_note


def test_starvation_is_said_at_eight_batches_of_drops_then_at_each_doubling_and_an_update_resets_it():
    starvation = Starvation(batch_groups=2)
    said = [n for n in range(1, 101) if starvation.group_dropped()]
    assert said == [STARVED_BATCHES * 2, STARVED_BATCHES * 4, STARVED_BATCHES * 8]
    starvation.updated()
    assert starvation.dropped == 0
    assert [n for n in range(1, 17) if starvation.group_dropped()] == [16]


def test_the_note_says_whether_the_policy_wins_none_or_all_of_its_tasks():
    assert starved_note(complete=50, all_fail=48, all_succeed=0).startswith(
        "48 of 50 complete groups failed in every rollout: the policy wins almost none of these tasks")
    assert "too easy" in starved_note(complete=50, all_fail=0, all_succeed=50)
    mixed = starved_note(complete=50, all_fail=30, all_succeed=20)
    assert mixed.startswith("30 of 50 complete groups failed in every rollout, 20 won in every one")
    assert "run.max_wall_s" in mixed and "warm start" not in mixed
    assert starved_note(complete=0, all_fail=0, all_succeed=0).startswith("0 of 0")  # no complete group yet: no advice


class _Lifecycle:
    def __init__(self):
        self.dropped = 0

    def learner_dropped(self, group_id):
        self.dropped += 1


async def test_the_report_consumer_warns_on_zero_variance_drops_only():
    counters = PhaseCounters(groups_complete=20, all_fail_complete=20)
    phase = SimpleNamespace(cfg=RunConfig(), counters=counters, lifecycle=_Lifecycle(), done=trio.Event(), version=0)
    batch = phase.cfg.learner.batch_groups
    events, events_in = trio.open_memory_channel((3 + STARVED_BATCHES) * batch)
    recorder = UpdateRecorder(phase, events=events, metrics=None, heldout=None, profiler=None, checkpointer=None, progress=None)
    send, receive = trio.open_memory_channel(0)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.consume, receive, nursery)
            async with send:
                for i in range(3 * batch):
                    await send.send(GroupsConsumed(cut=True, group_id=i, reason="cut"))  # refused cut groups are not starvation
                for i in range(STARVED_BATCHES * batch):
                    await send.send(GroupsConsumed(zero_variance=True, group_id=100 + i, reason="all_fail"))
    starved = [e for e in logs if e["event"] == "learner.starved"]
    assert len(starved) == 1 and starved[0]["log_level"] == "warning"
    assert starved[0]["dropped_zero_variance"] == STARVED_BATCHES * batch and starved[0]["since_update"] == 0
    assert "20 of 20 complete groups failed in every rollout" in starved[0]["note"]
    assert phase.lifecycle.dropped == (3 + STARVED_BATCHES) * batch
    assert counters.groups_dropped_zero_variance == STARVED_BATCHES * batch and counters.cut_groups_refused == 3 * batch
    dropped = [events_in.receive_nowait() for _ in range((3 + STARVED_BATCHES) * batch)]  # one GroupDropped per drop
    assert dropped[0] == GroupDropped(group_id=0, reason="cut") and dropped[-1].reason == "all_fail"
    assert [d.group_id for d in dropped] == [*range(3 * batch), *range(100, 100 + STARVED_BATCHES * batch)]
