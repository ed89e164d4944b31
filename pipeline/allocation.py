"""The allocator queue's mechanism: slot accounting, staleness pacing and the admission loop.

*Which* prompt gets the next slots is the allocator policy's call (`gates.allocators`); this module owns
*when*: a group starts as soon as the policy names one, enough slots are free, and the learner's staleness
bound allows it. Slots are trajectory-grained: each trajectory frees its slot the moment it ends (a
7-step success does not hold its slot until its group's 30-step failures end), and a cut frees every
slot of its group at once; either wakes the loop: that is backfill.

Staleness pacing (after AReaL): rollout groups that are running or waiting for the learner ("outstanding")
are capped at (1 + max_staleness) * B. With max_staleness = 0 every group is trained by the very next
update, on the weights that generated it; each extra unit lets groups run one policy version ahead.
Finished work is never dropped for being stale; admission waits instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import structlog
import trio

from .outcomes import FIRST_STAGE_KINDS

log = structlog.get_logger(__name__)

MAX_SKIPS_IN_ROW = 64
"""An admission screen may skip at most this many prompts in a row; the next one starts unscreened."""


class Clock(Protocol):
    def __call__(self) -> float: ...


class SlotPool:
    """G-slot groups take and free slots; busy slot-seconds are integrated for the occupancy figure."""

    def __init__(self, total: int, clock: Clock = trio.current_time) -> None:
        if total < 1:
            raise ValueError("a slot pool needs at least one slot")
        self.total = total
        self.busy = 0
        self._clock = clock
        self._since: float | None = None
        self._busy_seconds = 0.0
        self._elapsed = 0.0

    @property
    def free(self) -> int:
        return self.total - self.busy

    def _advance(self) -> None:
        now = self._clock()
        if self._since is not None:
            self._busy_seconds += self.busy * (now - self._since)
            self._elapsed += now - self._since
        self._since = now

    def start_clock(self) -> None:
        self._since = self._clock()

    def take(self, n: int) -> None:
        if n > self.free:
            raise RuntimeError(f"asked for {n} slots with only {self.free} free")
        self._advance()
        self.busy += n

    def release(self, n: int) -> None:
        if n > self.busy:
            raise RuntimeError(f"released {n} slots with only {self.busy} busy")
        self._advance()
        self.busy -= n

    def busy_seconds(self) -> float:
        """Busy slot-seconds since start_clock()."""
        self._advance()
        return self._busy_seconds

    def occupancy(self) -> float:
        """Busy slot-seconds / total slot-seconds since start_clock(); NaN before any time passed."""
        self._advance()
        return self._busy_seconds / (self.total * self._elapsed) if self._elapsed > 0 else float("nan")


@dataclass
class StalenessPacer:
    """Caps outstanding groups (running + waiting for the learner) at (1 + max_staleness) * batch_groups."""

    batch_groups: int
    max_staleness: int
    in_flight: int = 0
    """Rollout groups running now."""
    backlog: int = 0
    """Training groups handed to the learner and not yet consumed by an update (trained or dropped)."""

    @property
    def bound(self) -> int:
        return (1 + self.max_staleness) * self.batch_groups

    @property
    def outstanding(self) -> int:
        return self.in_flight + self.backlog

    def can_admit(self) -> bool:
        return self.outstanding < self.bound

    def admitted(self) -> None:
        self.in_flight += 1

    def finished(self, emitted: int) -> None:
        """A rollout group ended and the allocator released `emitted` training groups to the learner."""
        self.in_flight -= 1
        self.backlog += emitted

    def consumed(self, n: int) -> None:
        """The learner used up `n` training groups (trained on them or dropped them)."""
        self.backlog = max(0, self.backlog - n)


class AllocatorPolicy(Protocol):
    """The part of `gates.allocators.Allocator` the loop needs."""

    def next_admission(self, free_slots: int) -> Any: ...

    def on_admitted(self, group_id: int, admission: Any) -> None: ...


class AdmissionScreen(Protocol):
    """Asked before a prompt's first-stage group starts (`gates.zero_variance.AdmissionScreen`: k = 0)."""

    def skip(self, task_id: str) -> bool:
        """Skip this prompt (predicted to end with zero variance)?"""
        ...

    def admitted(self, group_id: int, task_id: str) -> None:
        """The prompt just screened was admitted as `group_id`."""
        ...


@runtime_checkable
class SkippingAllocator(Protocol):
    """An allocator that can be told a prompt it proposed was skipped (it counts it; nothing else changes)."""

    def on_skipped(self, admission: Any) -> None: ...


class AdmissionLoop:
    """Starts groups whenever slots, pacing and the allocator policy all say yes.

    `start_group(group_id, admission)` must start the group (e.g. `nursery.start_soon`) without awaiting
    it; the caller calls `trajectory_finished()` as each of its trajectories ends (its slot is free) and
    `group_finished(cut_slots=...)` when the group returns. Anything that may unblock admission calls `wake()`.
    """

    def __init__(
        self,
        policy: AllocatorPolicy,
        slots: SlotPool,
        pacer: StalenessPacer,
        start_group: Callable[[int, Any], None],
    ) -> None:
        self.policy = policy
        self.slots = slots
        self.pacer = pacer
        self._start_group = start_group
        self._changed = trio.Event()
        self._next_group_id = 0
        self.groups_admitted = 0
        self.backfills = 0
        """Admissions made into slots freed by a cut group (the gate's saving put back to work)."""
        self._backfill_credit = 0
        self._held = 0
        """Free slots the staleness pacer holds idle as of the last pass (0 when it allows an admission)."""
        self._held_since: float | None = None
        self._held_slot_s = 0.0
        self.screen: AdmissionScreen | None = None
        self.prompts_skipped = 0
        self._skips_in_row = 0
        self._screened = False

    def held_slot_seconds(self) -> float:
        """Slot-seconds that were free while the staleness pacer refused admission (decoders held by the pacer)."""
        now = self.slots._clock()
        if self._held_since is not None:
            self._held_slot_s += self._held * (now - self._held_since)
        self._held_since = now
        return self._held_slot_s

    def use_screen(self, screen: AdmissionScreen) -> bool:
        """Ask `screen` before each new prompt starts; False (not used) when the allocator cannot skip."""
        if not isinstance(self.policy, SkippingAllocator):
            log.warning("admission.screen_unused", reason="the allocator has no on_skipped", allocator=type(self.policy).__name__)
            return False
        self.screen = screen
        return True

    def _skipped(self, admission: Any) -> bool:
        """Screen a new prompt: True when it was skipped (the allocator was told)."""
        self._screened = False
        if self.screen is None or getattr(admission, "kind", "group") not in FIRST_STAGE_KINDS:
            return False
        if self._skips_in_row >= MAX_SKIPS_IN_ROW:
            self._skips_in_row = 0
            return False
        self._screened = True
        if not self.screen.skip(admission.task_id):
            self._skips_in_row = 0
            return False
        assert isinstance(self.policy, SkippingAllocator)
        self.policy.on_skipped(admission)
        self.prompts_skipped += 1
        self._skips_in_row += 1
        return True

    def wake(self) -> None:
        self._changed.set()

    def trajectory_finished(self) -> None:
        """One trajectory ended (complete, failed or cut): its slot is free now."""
        self.slots.release(1)
        self.wake()

    def group_finished(self, *, cut_slots: int = 0) -> None:
        """A group returned; `cut_slots` of its slots were freed by a cut (the next admissions into them
        count as backfills)."""
        self._backfill_credit += cut_slots
        self.wake()

    def admit_ready(self) -> int:
        """Admit as many groups as allowed right now; returns how many started."""
        self.held_slot_seconds()  # the hold so far, at the state the last pass left
        started = 0
        while self.pacer.can_admit() and self.slots.free > 0:
            admission = self.policy.next_admission(self.slots.free)
            if admission is None:
                break
            if self._skipped(admission):
                continue
            if admission.size > self.slots.free or admission.size < 1:
                raise RuntimeError(
                    f"allocator asked for {admission.size} slots with {self.slots.free} free"
                )
            group_id = self._next_group_id
            self._next_group_id += 1
            self.slots.take(admission.size)
            self.pacer.admitted()
            if self._backfill_credit > 0:
                self.backfills += 1
                self._backfill_credit = max(0, self._backfill_credit - admission.size)
            self.policy.on_admitted(group_id, admission)
            if self._screened:
                assert self.screen is not None
                self.screen.admitted(group_id, admission.task_id)
            self.groups_admitted += 1
            self._start_group(group_id, admission)
            started += 1
        self._held = self.slots.free if not self.pacer.can_admit() else 0
        return started

    @property
    def next_group_id(self) -> int:
        """Ids below this one were issued (group ids are never reused, not even across a resume)."""
        return self._next_group_id

    def state_dict(self) -> dict[str, int]:
        """Group ids and counters (a resumed run never reuses a group id)."""
        return {"next_group_id": self._next_group_id, "groups_admitted": self.groups_admitted, "backfills": self.backfills}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._next_group_id = state["next_group_id"]
        self.groups_admitted = state["groups_admitted"]
        self.backfills = state["backfills"]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Admit forever; each state change (slots freed, update published) triggers another pass."""
        self.slots.start_clock()
        task_status.started()
        while True:
            self.admit_ready()
            await self._changed.wait()
            self._changed = trio.Event()
