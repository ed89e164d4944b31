"""A rollout group's whole life, owned by admission: admit, run, finish, hand to the allocator, send.

`GroupLifecycle` admits groups (through `AdmissionLoop`: slots, staleness pacing, the allocator policy's
choice), runs each one in a nursery of its own (`rollout.run_group`), and when it returns: frees the cut
slots for backfill, counts it (`PhaseCounters.group_finished`), settles its prompt's merged outcome, asks
the allocator which training groups it releases, refuses a cut one (an allocator bug must never leak a cut
group into training: counted, logged, dropped — the one place this is decided before the learner), sends
the result to the event stream and the training groups to the learner, and wakes itself. The runtime tells
it what the learner did (`learner_dropped`, `learner_updated`); rollout trajectories call
`trajectory_finished` as each ends.
"""

from __future__ import annotations

from typing import Any, Protocol

import structlog
import trio

from .allocation import AdmissionLoop, AllocatorPolicy, SlotPool, StalenessPacer
from .counters import PhaseCounters
from .ledger import Work
from .messages import AnyMessage, GroupResult, TrajectoryStatus
from .outcomes import FIRST_STAGE_KINDS, MergedOutcomes, label_rewards

log = structlog.get_logger(__name__)

PROMPTS_DROPPED = "allocator/prompts_dropped"


class GroupRunner(Protocol):
    """The part of the rollout stage the lifecycle needs."""

    async def run_group(self, group_id: int, task_id: str, size: int, *, kind: str = "group",
                        parent: int | None = None) -> GroupResult: ...


class LifecycleAllocator(AllocatorPolicy, Protocol):
    """The part of `gates.allocators.Allocator` the lifecycle needs: admission's part (`AllocatorPolicy`),
    and the post-rollout side (which finished groups train, and the learner's updates)."""

    def on_result(self, result: GroupResult) -> list[GroupResult]: ...

    def on_update(self, version: int) -> None: ...


class TrainingSink(Protocol):
    """Where training groups go (announced to the learner, then sent)."""

    async def send(self, group: GroupResult, /) -> None: ...


class GroupLifecycle:
    def __init__(
        self, allocator: LifecycleAllocator, slots: SlotPool, pacer: StalenessPacer, counters: PhaseCounters, *,
        group_size: int, training: TrainingSink, events: trio.MemorySendChannel[AnyMessage],
    ) -> None:
        self.allocator = allocator
        self.pacer = pacer
        self.counters = counters
        self.training = training
        self.events = events
        self.rollout: GroupRunner | None = None
        self.admission = AdmissionLoop(allocator, slots, pacer, self._start)
        self.merged = MergedOutcomes(on_settled=self._settled, window=64)
        self._group_size = group_size
        self._groups: trio.Nursery | None = None
        self.at_learner: dict[int, None] = {}
        """Training groups sent to the learner and not yet trained or dropped, in the order sent (bounded by
        the staleness budget); those left when the phase ends are `GroupDropped(reason="run_ended")`."""

    @property
    def groups_admitted(self) -> int:
        return self.admission.groups_admitted

    @property
    def backfills(self) -> int:
        return self.admission.backfills

    async def run(self, rollout: GroupRunner, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Admit and run groups until cancelled."""
        self.rollout = rollout
        async with trio.open_nursery() as groups:
            self._groups = groups
            await groups.start(self.admission.run)
            task_status.started()

    def trajectory_finished(self) -> None:
        """A trajectory ended (complete, failed or cut): its slot is free."""
        self.admission.trajectory_finished()

    def learner_dropped(self, group_id: int = -1) -> None:
        """The learner dropped a training group without training on it."""
        self.at_learner.pop(group_id, None)
        self.pacer.consumed(1)
        self.admission.wake()

    def learner_updated(self, version: int, groups_trained: int, group_ids: tuple[int, ...] = ()) -> None:
        for group_id in group_ids:
            self.at_learner.pop(group_id, None)
        self.pacer.consumed(groups_trained)
        self.allocator.on_update(version)
        self.admission.wake()

    def finish(self, running: Work | None = None) -> None:
        """The phase ended: groups not trained by now, and `running` (the work of the groups it cancelled), are
        unfinished in the ledger; then settle every prompt still open."""
        self.counters.ledger.run_ended(running or Work())
        self.merged.flush()

    def _settled(self, rewards: list[float], root: object) -> None:
        self.counters.prompt_settled(rewards, self._group_size)
        if isinstance(root, int):
            self.counters.ledger.prompt_settled(root)

    def _start(self, group_id: int, admission: Any) -> None:
        assert self._groups is not None
        self._groups.start_soon(self._run_one, group_id, admission)

    async def _run_one(self, group_id: int, admission: Any) -> None:
        assert self.rollout is not None
        kind = getattr(admission, "kind", "group")
        parent = getattr(admission, "parent", None)
        if kind in FIRST_STAGE_KINDS:
            self.merged.open_root(group_id, kind, data=group_id)
        else:
            self.merged.open_child(group_id, parent)
        result = await self.rollout.run_group(group_id, admission.task_id, admission.size, kind=kind, parent=parent)
        root = self.counters.ledger.group_finished(result)  # before any await: a cancel now cannot lose its work
        cut_slots = sum(t.status == TrajectoryStatus.CUT for t in result.trajectories) if result.cut else 0
        self.admission.group_finished(cut_slots=cut_slots)
        self.counters.group_finished(result)
        if result.cut:
            self.merged.discard(group_id)
        else:
            self.merged.add(group_id, label_rewards(result))
        dropped_before = self._prompts_dropped()
        training = self._training_groups(result)
        self.counters.ledger.answered(root, training, dropped=self._prompts_dropped() > dropped_before)
        self.pacer.finished(len(training))
        await self.events.send(result)
        for group in training:
            self.at_learner[group.group_id] = None
            await self.training.send(group)
        self.admission.wake()

    def _prompts_dropped(self) -> float:
        """The allocator's own count of prompts it dropped (every built-in reports `allocator/prompts_dropped`;
        a plugin that does not leaves its unreleased pilots to settle by `MergedOutcomes`' window)."""
        statistics = getattr(self.allocator, "statistics", None)
        return float(statistics().get(PROMPTS_DROPPED, 0.0)) if statistics is not None else 0.0

    def _training_groups(self, result: GroupResult) -> list[GroupResult]:
        training = self.allocator.on_result(result)
        refused = [g for g in training if g.cut]
        if refused:
            self.counters.cut_emission_refused += len(refused)
            log.error("grpo.allocator_emitted_cut_group", group_ids=[g.group_id for g in refused])
            training = [g for g in training if not g.cut]
        return training
