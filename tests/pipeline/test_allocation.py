"""Slot accounting, staleness pacing and backfill in the admission loop."""

from dataclasses import dataclass

import pytest
import trio

from pipeline.allocation import AdmissionLoop, SlotPool, StalenessPacer


@dataclass
class _Admission:
    task_id: str
    size: int


class _Policy:
    def __init__(self, size):
        self.size = size
        self.admitted = []

    def next_admission(self, free_slots):
        return _Admission(f"t{len(self.admitted)}", self.size) if free_slots >= self.size else None

    def on_admitted(self, group_id, admission):
        self.admitted.append(group_id)


def test_occupancy_integrates_busy_slot_seconds():
    now = [0.0]
    pool = SlotPool(4, clock=lambda: now[0])
    pool.start_clock()
    pool.take(4)
    now[0] = 1.0
    pool.release(2)
    now[0] = 2.0
    assert pool.occupancy() == pytest.approx((4 * 1 + 2 * 1) / (4 * 2))


def test_slots_the_pacer_holds_free_are_integrated_for_the_idle_fraction():
    now = [0.0]
    pool = SlotPool(8, clock=lambda: now[0])
    pacer = StalenessPacer(batch_groups=2, max_staleness=0)  # at most 2 groups outstanding
    loop = AdmissionLoop(_Policy(size=2), pool, pacer, lambda gid, adm: None)
    pool.start_clock()
    assert loop.admit_ready() == 2  # 4 of 8 slots taken; the pacer holds the other 4 free
    now[0] = 3.0
    for _ in range(2):
        loop.trajectory_finished()  # 2 more free: the pass after them sees 6 held
    loop.admit_ready()
    now[0] = 4.0
    assert loop.held_slot_seconds() == pytest.approx(4 * 3 + 6 * 1)
    pacer.finished(emitted=0)
    pacer.finished(emitted=0)  # budget back: 2 more groups, then the pacer holds the last 2 slots
    assert loop.admit_ready() == 2
    now[0] = 10.0
    assert loop.held_slot_seconds() == pytest.approx(4 * 3 + 6 * 1 + 2 * 6)
    assert pool.busy_seconds() == pytest.approx(4 * 3 + 2 * 1 + 6 * 6)


def test_slot_pool_refuses_overdraw():
    pool = SlotPool(2, clock=lambda: 0.0)
    with pytest.raises(RuntimeError):
        pool.take(3)


def test_pacer_bound_follows_staleness():
    pacer = StalenessPacer(batch_groups=4, max_staleness=0)
    for _ in range(4):
        assert pacer.can_admit()
        pacer.admitted()
    assert not pacer.can_admit()
    pacer.finished(emitted=1)  # still waiting at the learner: counts
    assert not pacer.can_admit()
    pacer.finished(emitted=0)  # dropped/cut: frees budget
    assert pacer.can_admit()
    assert StalenessPacer(batch_groups=4, max_staleness=2).bound == 12


async def test_cut_group_slots_are_backfilled_immediately(autojump_clock):
    policy = _Policy(size=2)
    slots = SlotPool(4)
    pacer = StalenessPacer(batch_groups=100, max_staleness=0)
    started = []
    loop = AdmissionLoop(policy, slots, pacer, lambda gid, adm: started.append((trio.current_time(), gid)))
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        assert [gid for _, gid in started] == [0, 1] and slots.free == 0
        await trio.sleep(3.0)
        pacer.finished(emitted=0)
        loop.trajectory_finished()
        loop.trajectory_finished()
        loop.group_finished(cut_slots=2)
        await trio.testing.wait_all_tasks_blocked()
        assert started[-1] == (3.0, 2)  # admitted at the very instant the cut freed the slots
        assert loop.backfills == 1
        nursery.cancel_scope.cancel()


async def test_admission_waits_for_the_learner_not_for_slots(autojump_clock):
    policy = _Policy(size=1)
    slots = SlotPool(8)
    pacer = StalenessPacer(batch_groups=2, max_staleness=0)
    loop = AdmissionLoop(policy, slots, pacer, lambda gid, adm: None)
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        assert policy.admitted == [0, 1] and slots.free == 6  # paced: 2 outstanding max
        for _ in range(2):
            slots.release(1)
            pacer.finished(emitted=1)
        loop.wake()
        await trio.testing.wait_all_tasks_blocked()
        assert len(policy.admitted) == 2  # finished but not yet trained: still outstanding
        pacer.consumed(2)
        loop.wake()
        await trio.testing.wait_all_tasks_blocked()
        assert len(policy.admitted) == 4
        nursery.cancel_scope.cancel()


async def test_a_trajectory_frees_its_slot_when_it_ends_not_when_its_group_does(autojump_clock):
    policy = _Policy(size=2)
    slots = SlotPool(4)
    pacer = StalenessPacer(batch_groups=100, max_staleness=0)
    started = []
    loop = AdmissionLoop(policy, slots, pacer, lambda gid, adm: started.append((trio.current_time(), gid)))
    async with trio.open_nursery() as nursery:
        await nursery.start(loop.run)
        assert slots.free == 0
        await trio.sleep(1.0)
        loop.trajectory_finished()  # group 0's short success ended; its sibling still runs
        await trio.sleep(1.0)
        loop.trajectory_finished()  # group 1's first member ended: two slots are free across groups
        await trio.testing.wait_all_tasks_blocked()
        assert started[-1] == (2.0, 2) and slots.free == 0
        assert loop.backfills == 0  # nothing was cut
        nursery.cancel_scope.cancel()


class _Screen:
    """Skips the tasks named in `skip`; records what was admitted."""

    def __init__(self, skip):
        self.skip_ids, self.asked, self.started = set(skip), [], []

    def skip(self, task_id):
        self.asked.append(task_id)
        return task_id in self.skip_ids

    def admitted(self, group_id, task_id):
        self.started.append((group_id, task_id))


class _SkippingPolicy:
    """Proposes t0, t1, t2... (a new prompt each time); counts the skipped ones."""

    def __init__(self, kind="group"):
        self.proposed = self.admitted = 0
        self.skipped, self.kind = [], kind

    def next_admission(self, free_slots):
        self.proposed += 1
        return _Kinded(f"t{self.proposed - 1}", 2, self.kind)

    def on_admitted(self, group_id, admission):
        self.admitted += 1

    def on_skipped(self, admission):
        self.skipped.append(admission.task_id)


@dataclass
class _Kinded:
    task_id: str
    size: int
    kind: str


async def test_a_screened_prompt_is_skipped_and_the_allocator_told():
    policy, started = _SkippingPolicy(), []
    loop = AdmissionLoop(policy, SlotPool(4), StalenessPacer(8, 0), lambda gid, adm: started.append((gid, adm.task_id)))
    screen = _Screen({"t0", "t2"})
    assert loop.use_screen(screen)
    assert loop.admit_ready() == 2
    assert started == [(0, "t1"), (1, "t3")]  # group ids are issued to admitted groups only
    assert policy.skipped == ["t0", "t2"] and loop.prompts_skipped == 2
    assert screen.started == [(0, "t1"), (1, "t3")]


async def test_later_stages_are_not_screened_and_skips_in_a_row_are_bounded():
    from pipeline.allocation import MAX_SKIPS_IN_ROW

    policy = _SkippingPolicy(kind="commit")
    loop = AdmissionLoop(policy, SlotPool(2), StalenessPacer(8, 0), lambda gid, adm: None)
    screen = _Screen({"t0"})
    loop.use_screen(screen)
    assert loop.admit_ready() == 1 and screen.asked == [] and screen.started == []
    everything = _Screen({f"t{i}" for i in range(1000)})
    policy = _SkippingPolicy()
    loop = AdmissionLoop(policy, SlotPool(2), StalenessPacer(8, 0), lambda gid, adm: None)
    loop.use_screen(everything)
    assert loop.admit_ready() == 1  # the run never stalls on a screen that skips everything
    assert len(policy.skipped) == MAX_SKIPS_IN_ROW and everything.started == []


async def test_an_allocator_that_cannot_skip_is_never_screened():
    loop = AdmissionLoop(_Policy(2), SlotPool(2), StalenessPacer(8, 0), lambda gid, adm: None)
    screen = _Screen({"t0"})
    assert not loop.use_screen(screen)
    assert loop.admit_ready() == 1 and screen.asked == []
