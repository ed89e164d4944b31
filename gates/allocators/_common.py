"""Pieces every built-in allocator shares: the task cycle, the accounting ledger, pacing, group helpers.

Nothing here is part of the allocator contract (see `base.py`); a user's allocator may ignore this module.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus
from pipeline.outcomes import is_zero_variance as is_zero_variance
from pipeline.outcomes import label_rewards

# --------------------------------------------------------------------------------------------------
# Group helpers


def rewards_of(result: GroupResult) -> list[float]:
    """Rewards of the complete trajectories (failed and cut ones are no label)."""
    return label_rewards(result)


def successes_of(result: GroupResult) -> list[bool]:
    return [t.success for t in result.trajectories]


def trainable(result: GroupResult) -> bool:
    """A group may reach the learner: not cut, and no trajectory of it was cut."""
    return not result.cut and all(t.status != TrajectoryStatus.CUT for t in result.trajectories)


def merge_groups(first: GroupResult, *more: GroupResult) -> GroupResult:
    """One training group from several rollout groups of one prompt (pilot + commit, explore + rescues).

    Keeps `first`'s group id and task; trajectories are concatenated and renumbered 0..n-1 so rollout
    indices stay unique; `wall_s` is the sum.
    """
    trajectories: list[Trajectory] = []
    for part in (first, *more):
        for t in part.trajectories:
            trajectories.append(msgspec.structs.replace(t, rollout_index=len(trajectories)))
    wall_s = first.wall_s + sum(part.wall_s for part in more)
    return msgspec.structs.replace(first, trajectories=trajectories, wall_s=wall_s)


def subset(result: GroupResult, indices: Sequence[int]) -> GroupResult:
    """The group restricted to `indices` (in that order), renumbered."""
    kept = [msgspec.structs.replace(result.trajectories[i], rollout_index=j) for j, i in enumerate(indices)]
    return msgspec.structs.replace(result, trajectories=kept)


def result_to_state(result: GroupResult) -> dict[str, Any]:
    return msgspec.to_builtins(result)


def result_from_state(state: Mapping[str, Any]) -> GroupResult:
    return msgspec.convert(state, GroupResult)


def require_fit(size: int, free_slots: int, in_flight: int, who: str) -> bool:
    """Whether an admission of `size` can start now. Waiting is only allowed while some group is in flight
    (it will free slots); with nothing in flight `free_slots` is every slot, so waiting would deadlock."""
    if size <= free_slots:
        return True
    if in_flight == 0:
        raise ValueError(
            f"{who}: a group of {size} rollouts needs more slots than exist ({free_slots}); "
            f"raise rollout.slots or lower the allocator's group sizes"
        )
    return False


# --------------------------------------------------------------------------------------------------
# Task cycle


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


# --------------------------------------------------------------------------------------------------
# Accounting


class Ledger:
    """Counters behind `statistics()`, shared by every built-in allocator.

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


# --------------------------------------------------------------------------------------------------
# Pacing


class YieldPacer:
    """Expected-yield admission control (allocators.md §1e, §4e, §7 "target sizing").

    Training groups are `ready` once emitted and until a learner update consumes a batch of B. New prompts
    are admitted while `ready + sure + yield_rate * in_flight < B * (1 + lookahead)`, where `sure` counts
    pending groups that will train unless cut (e.g. committed prompts) and `yield_rate` is a running rate of
    training groups per finished prompt visit. With nothing in flight it always admits: `ready` is only an
    estimate (the learner may drop emitted groups), and only a finished group or an update asks again, so
    refusing then could stall the run.
    """

    def __init__(self, batch_groups: int, lookahead: float, window: int | None = None) -> None:
        self.batch_groups = batch_groups
        self.lookahead = lookahead
        self.window = window or batch_groups
        self.yield_rate = 1.0
        self.observed = 0
        self.ready = 0

    def observe(self, yielded: bool) -> None:
        """A prompt visit finished; running mean over the first `window` visits, then an EMA."""
        self.observed += 1
        self.yield_rate += (float(yielded) - self.yield_rate) / min(self.observed, self.window)

    def emitted(self, groups: int = 1) -> None:
        self.ready += groups

    def updated(self) -> None:
        self.ready = max(0, self.ready - self.batch_groups)

    def need(self, sure: int = 0) -> int:
        """Training groups still wanted from new prompts."""
        return max(0, math.ceil(self.batch_groups * (1.0 + self.lookahead)) - self.ready - sure)

    def admit(self, in_flight_new: int, sure: int = 0, *, in_flight: int | None = None) -> bool:
        """Admit another new prompt? `in_flight_new`: first-stage groups in flight (their yield is uncertain);
        `in_flight`: every rollout group in flight (defaults to `in_flight_new`)."""
        if (in_flight_new if in_flight is None else in_flight) == 0:
            return True
        need = self.need(sure)
        return need > 0 and self.yield_rate * in_flight_new < need

    def state_dict(self) -> dict[str, Any]:
        return {"yield_rate": self.yield_rate, "observed": self.observed, "ready": self.ready}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.yield_rate = float(state["yield_rate"])
        self.observed = int(state["observed"])
        self.ready = int(state["ready"])
