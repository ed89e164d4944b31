"""Checkpoint bookkeeping shared by threshold gates: when is checkpoint K ready for a group?

The rule is the prefix gate's (gates/prefix.py): checkpoint K of a group is evaluated once every member has
K steps or has ended (done or failed); never if every member ended before step K; checkpoints are
evaluated in ascending order, each once, until one cuts. A subclass supplies the pure statistic of the
members' step events so far; the group is cut iff statistic < tau.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from pipeline.messages import RolloutFailed, StepEvent

from .base import Checkpoint, Threshold
from .prefix import GateDecision


@dataclass(slots=True)
class _Group:
    steps: list[list[StepEvent]]
    ended: list[bool]
    pending: list[int]
    decisions: list[GateDecision] = field(default_factory=list)

    def ready(self) -> bool:
        k = self.pending[0]
        return all(len(s) >= k or done for s, done in zip(self.steps, self.ended, strict=True))


class CheckpointGate(abc.ABC):
    """Base of threshold gates over the step stream (the `gates.base.Gate` shape).

    Subclasses set `name`, define `Options` (a subclass of `CheckpointGate.Options` with their own
    defaults and extra options) and implement `statistic(steps, k) -> float` (pure; lower = more surely a
    zero-variance group) and may override `describe`.
    """

    name = "checkpoint"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        k: Checkpoint
        """The first checkpoint K."""
        tau: Threshold
        """Cut iff the statistic < tau."""
        checkpoints: list[Checkpoint] = []
        """Extra checkpoints K (besides `k`), evaluated in order until one cuts."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.tau = options.tau
        self.checkpoints = sorted({options.k, *options.checkpoints})
        self._groups: dict[int, _Group] = {}

    @abc.abstractmethod
    def statistic(self, steps: Sequence[Sequence[StepEvent]], k: int) -> float:
        """steps: [G][steps so far] each member's events (failed members keep theirs)."""

    def describe(self, value: float, k: int, cut: bool) -> str:
        return f"{self.name} s_{k}={value:.3f} {'<' if cut else '>='} tau={self.tau}"

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    def open(self, group_id: int, size: int) -> None:
        self._groups[group_id] = _Group([[] for _ in range(size)], [False] * size, list(self.checkpoints))

    def close(self, group_id: int) -> list[GateDecision]:
        group = self._groups.pop(group_id, None)
        return group.decisions if group else []

    def observe(self, event: StepEvent | RolloutFailed) -> GateDecision | None:
        group = self._groups.get(event.group_id)
        if group is None or not group.pending:
            return None
        r = event.rollout_index
        if isinstance(event, RolloutFailed):
            group.ended[r] = True
        else:
            group.steps[r].append(event)
            group.ended[r] |= event.done
        latest = None
        while group.pending and group.ready():
            k = group.pending.pop(0)
            if all(group.ended) and max(map(len, group.steps)) < k:
                group.pending.clear()  # every member ended before K: never evaluated
                break
            value = self.statistic(group.steps, k)
            cut = value < self.tau
            latest = GateDecision(cut=cut, value=value, checkpoint=k, reason=self.describe(value, k, cut))
            group.decisions.append(latest)
            if cut:
                group.pending.clear()
        return latest
