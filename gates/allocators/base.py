"""The streaming allocator contract: who gets the next free rollout slots, and which finished groups train.

The runtime asks `next_admission(free_slots)` whenever slots free up (a finished or cut group, or start)
and hands every finished group to `on_result`, which returns the *training groups* that are ready for the
learner (possibly merged from several rollout groups of one prompt, e.g. pilot + commit; possibly none,
e.g. DAPO drops a zero-variance group). `on_update` is called after each learner update.

Allocators are registered in `gates.allocators.ALLOCATORS` like any plugin; each class declares its
options as a msgspec Struct named `Options`, decoded strictly from the `[allocator.options]` table.

`AllocatorBase` holds the bookkeeping every allocator needs (the rng, a reshuffled task cycle, the groups in
flight, the `Ledger` behind the standard statistics, checkpoints of all of them): the built-ins subclass it,
and so can a custom allocator, which then writes only `next_admission` and, when it does more than train
every complete group, `decide`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pipeline.contracts import Admission as Admission  # re-exported: the contract lives in pipeline/
from pipeline.contracts import Task
from pipeline.messages import GroupResult

from ._common import is_zero_variance, require_fit, rewards_of, trainable


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
        rollouts_spent, rollouts_trained, zero_variance_fraction and effective_prompt_ratio (`Ledger`, kept
        by `AllocatorBase`), plus their own."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class AllocatorBase:
    """The bookkeeping an allocator shares with every built-in: subclass it and write `next_admission`.

    It keeps `rng` (seeded from the context), `cycle` (the train tasks in reshuffled passes; None when the
    subclass passes `cycle=False` and draws its own way), `in_flight` (admissions by group id, from
    `on_admitted` to `on_result`) and `ledger` (the standard `allocator/...` counters). `on_result` counts
    the group and hands it to `decide`, which returns the training groups through `train(group)` or gives
    the prompt up with `drop()`; the default trains every complete group (plain GRPO). A visit (`Ledger`)
    starts with an admission without a `parent`. `statistics()` and `state_dict()` hold all of the above
    plus what `extra_statistics()` / `extra_state()` add; `load_state_dict` restores them, and
    `load_extra_state` the rest. Groups in flight do not survive a checkpoint (`Ledger.state_dict`);
    `pending_kept()` says how many pending visits the subclass restores (pilots waiting for a commit...).
    """

    name: str = "allocator"

    def __init__(self, options: Any, ctx: AllocatorContext, *, cycle: bool = True) -> None:
        if not ctx.tasks:
            raise ValueError(f"{self.name} allocator: no tasks to admit")
        self.options = options
        self.ctx = ctx
        self.rng = random.Random(ctx.seed)
        self.cycle = TaskCycle([t.task_id for t in ctx.tasks], self.rng) if cycle else None
        self.in_flight: dict[int, Admission] = {}
        self.ledger = Ledger()

    # -- the contract

    def next_admission(self, free_slots: int) -> Admission | None:
        raise NotImplementedError(f"{type(self).__name__} must define next_admission")

    def on_admitted(self, group_id: int, admission: Admission) -> None:
        self.in_flight[group_id] = admission
        self.ledger.admitted(admission.size, new_prompt=admission.parent is None)

    def on_result(self, result: GroupResult) -> list[GroupResult]:
        admission = self.in_flight.pop(result.group_id)
        self.ledger.finished(result)
        return self.decide(result, admission)

    def on_update(self, version: int) -> None:
        pass

    def statistics(self) -> Mapping[str, float]:
        stats = dict(self.ledger.statistics())
        if self.cycle is not None:
            stats["allocator/epoch"] = float(self.epoch)
        return {**stats, **self.extra_statistics()}

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": rng_state(self.rng)}
        if self.cycle is not None:
            state["cycle"] = self.cycle.state_dict()
        state["ledger"] = self.ledger.state_dict(pending_kept=self.pending_kept())
        return {**state, **self.extra_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        set_rng_state(self.rng, state["rng"])
        if self.cycle is not None:
            self.cycle.load_state_dict(state["cycle"])
        self.ledger.load_state_dict(state["ledger"])
        self.in_flight.clear()
        self.load_extra_state(state)

    # -- what a subclass writes or calls

    def decide(self, result: GroupResult, admission: Admission) -> list[GroupResult]:
        """The training groups `result` releases (the ledger has counted it): by default, every complete group
        trains and a cut one ends its prompt's visit."""
        if not trainable(result):
            return self.drop()
        return [self.train(result)]

    def train(self, group: GroupResult) -> GroupResult:
        """Count `group` as a training group (it ends its prompt's visit) and return it."""
        return self.ledger.trained(group)

    def drop(self) -> list[GroupResult]:
        """Give the current prompt's visit up: no training group."""
        self.ledger.dropped()
        return []

    def next_task(self) -> str:
        """The next task id of the cycle (a new pass reshuffles them)."""
        if self.cycle is None:
            raise TypeError(f"{type(self).__name__} was built with cycle=False: it draws its own tasks")
        return self.cycle.next()

    @property
    def epoch(self) -> int:
        """The 0-based pass over the tasks (-1 before the first draw; -1 without a cycle)."""
        return -1 if self.cycle is None else self.cycle.epoch

    def fits(self, size: int, free_slots: int) -> bool:
        """Whether a group of `size` can start now; raises when it never can (`require_fit`)."""
        return require_fit(size, free_slots, len(self.in_flight), f"{self.name} allocator")

    def extra_statistics(self) -> Mapping[str, float]:
        return {}

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        pass

    def pending_kept(self) -> int:
        return 0


class TaskCycle:
    """Task ids in reshuffled passes (epochs); never runs out. `epoch` is the 0-based pass index."""

    def __init__(self, task_ids: Sequence[str], rng: random.Random) -> None:
        if not task_ids:
            raise ValueError("no tasks to admit")
        self._ids = list(task_ids)
        self._rng = rng
        self._order: list[str] = []
        self.epoch = -1

    def next(self) -> str:
        if not self._order:
            self._order = list(self._ids)
            self._rng.shuffle(self._order)
            self.epoch += 1
        return self._order.pop()

    def __len__(self) -> int:
        return len(self._ids)

    def state_dict(self) -> dict[str, Any]:
        return {"order": list(self._order), "epoch": self.epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._order = list(state["order"])
        self.epoch = int(state["epoch"])


def rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: Sequence[Any]) -> None:
    """random.Random state survives a JSON round trip as nested lists; setstate wants tuples."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


class Ledger:
    """Counters behind `statistics()`: `AllocatorBase` keeps one; the standard `allocator/...` keys.

    A *visit* is one prompt's trip through the allocator: it opens with the first rollout group admitted for
    the prompt (group, pilot, explore) and closes when a training group is emitted (`trained`) or when the
    prompt is given up (`dropped`: zero-variance, out of band, cut, expired). So at every moment
    `prompts_admitted == prompts_trained + prompts_dropped + prompts_pending`.
    """

    _COUNTERS = (
        "prompts_admitted",
        "prompts_skipped",
        "prompts_trained",
        "prompts_dropped",
        "groups_admitted",
        "groups_completed",
        "groups_cut",
        "groups_lost",
        "groups_zero_variance",
        "groups_trained",
        "groups_trained_zero_variance",
        "rollouts_spent",
        "rollouts_trained",
    )

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(self._COUNTERS, 0)

    def admitted(self, size: int, *, new_prompt: bool) -> None:
        self.counts["groups_admitted"] += 1
        self.counts["rollouts_spent"] += size
        self.counts["prompts_admitted"] += int(new_prompt)

    def skipped(self) -> None:
        self.counts["prompts_skipped"] += 1

    def finished(self, result: GroupResult) -> None:
        """A rollout group came back (before any decision on it)."""
        if result.cut:
            self.counts["groups_cut"] += 1
            return
        self.counts["groups_completed"] += 1
        self.counts["groups_zero_variance"] += int(is_zero_variance(rewards_of(result)))

    def trained(self, group: GroupResult) -> GroupResult:
        self.counts["prompts_trained"] += 1
        self.counts["groups_trained"] += 1
        self.counts["groups_trained_zero_variance"] += int(is_zero_variance(rewards_of(group)))
        self.counts["rollouts_trained"] += len(group.trajectories)
        return group

    def dropped(self) -> None:
        self.counts["prompts_dropped"] += 1

    @property
    def in_flight(self) -> int:
        """Rollout groups admitted and not yet back."""
        c = self.counts
        return c["groups_admitted"] - c["groups_completed"] - c["groups_cut"] - c["groups_lost"]

    @property
    def pending(self) -> int:
        c = self.counts
        return c["prompts_admitted"] - c["prompts_trained"] - c["prompts_dropped"]

    def statistics(self) -> dict[str, float]:
        c = self.counts
        stats: dict[str, float] = {f"allocator/{k}": float(v) for k, v in c.items()}
        stats["allocator/prompts_pending"] = float(self.pending)
        stats["allocator/zero_variance_fraction"] = c["groups_zero_variance"] / max(c["groups_completed"], 1)
        effective = c["groups_trained"] - c["groups_trained_zero_variance"]
        stats["allocator/effective_prompt_ratio"] = effective / max(c["prompts_admitted"], 1)
        return stats

    def state_dict(self, pending_kept: int) -> dict[str, int]:
        """Counters as they will read after a resume: in-flight rollouts do not survive a checkpoint, so they
        count as `groups_lost`, and every pending visit except the `pending_kept` ones the allocator restores
        (e.g. pilots waiting for their commit) is counted as dropped."""
        state = dict(self.counts)
        state["groups_lost"] += self.in_flight
        state["prompts_dropped"] += self.pending - pending_kept
        return state

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.counts = {k: int(state[k]) for k in self._COUNTERS}
