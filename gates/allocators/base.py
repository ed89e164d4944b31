"""The streaming allocator contract: who gets the next free rollout slots, and which finished groups train.

The runtime asks `next_admission(free_slots)` whenever slots free up (a finished or cut group, or start)
and hands every finished group to `on_result`, which returns the *training groups* that are ready for the
learner (possibly merged from several rollout groups of one prompt, e.g. pilot + commit; possibly none,
e.g. DAPO drops a zero-variance group). `on_update` is called after each learner update.

Allocators are registered in `gates.allocators.ALLOCATORS` like any plugin; each class declares its
options as a msgspec Struct named `Options`, decoded strictly from the `[allocator.options]` table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pipeline.contracts import Admission as Admission  # re-exported: the contract lives in pipeline/
from pipeline.contracts import Task
from pipeline.messages import GroupResult


@dataclass(frozen=True, slots=True)
class AllocatorContext:
    """Everything an allocator may know at construction."""

    tasks: Sequence[Task]
    """The train tasks it may admit."""
    group_size: int
    """G from the rollout config (the nominal group size)."""
    batch_groups: int
    """B: training groups per learner update."""
    seed: int


@runtime_checkable
class Allocator(Protocol):
    name: str

    def next_admission(self, free_slots: int) -> Admission | None:
        """The next group to start in at most `free_slots` slots, or None to leave the slots idle for now.

        Must not deadlock the run: with no group in flight, None is only allowed while a learner update is
        due (B training groups are waiting), because only a finished group or an update asks again.
        """
        ...

    def on_admitted(self, group_id: int, admission: Admission) -> None:
        """The runtime started `admission` as rollout group `group_id`."""
        ...

    def on_result(self, result: GroupResult) -> list[GroupResult]:
        """A rollout group finished (cut or complete). Returns the training groups now ready: never a cut
        group; a group merged from several rollout groups keeps the group id of the first one."""
        ...

    def on_update(self, version: int) -> None:
        """The learner published weight `version`."""
        ...

    def statistics(self) -> Mapping[str, float]:
        """Accounting under `allocator/...`. The built-ins all report prompts_admitted, prompts_skipped,
        prompts_trained, prompts_dropped, prompts_pending, groups_admitted, groups_cut, groups_trained,
        rollouts_spent, rollouts_trained, zero_variance_fraction and effective_prompt_ratio (see
        `gates.allocators._common.Ledger`), plus their own."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
