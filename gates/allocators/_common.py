"""Helpers the built-in allocators share beyond `AllocatorBase` (`base.py`): group helpers and pacing.

Nothing here is part of the allocator contract; a user's allocator may reuse it or ignore it.
"""

from __future__ import annotations

import math
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
