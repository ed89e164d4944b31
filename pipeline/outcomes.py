"""What a finished group says about learning, shared by every stage that labels groups.

One definition of "zero variance" (the gate's shadow labels, the learner's filter, the summary figures
all use it) and the merged outcome of a prompt whose allocator runs it in several rollout groups
(Pilot-Commit's pilot + commit, AERO's explore + rescue): a first-stage group's label is the label of the
prompt's merged group, not of its own few rollouts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .messages import GroupResult, TrajectoryStatus

FIRST_STAGE_KINDS = frozenset({"group", "pilot", "explore"})
"""Admission kinds that open a prompt's first rollout group (the only ones a gate may cut)."""
EXTENDABLE_KINDS = frozenset({"pilot", "explore"})
"""First-stage kinds that later groups of the same prompt may extend (commit, rescue)."""


DROP_REASONS = ("all_fail", "all_succeed", "zero_variance", "cut", "run_ended")
"""`GroupDropped.reason`: no rollout won / every complete one won / equal rewards otherwise (the learner's
zero-variance filter), a cut group refused, or still waiting for the learner when the phase ended."""


def drop_reason(group: GroupResult) -> str:
    """Why the learner drops `group` (cut, or zero variance by its outcome): a `DROP_REASONS` entry."""
    if group.cut:
        return "cut"
    complete = [t for t in group.trajectories if t.status == TrajectoryStatus.COMPLETE]
    wins = sum(t.success for t in complete)
    if wins == 0:
        return "all_fail"
    return "all_succeed" if wins == len(complete) else "zero_variance"


def is_gated(kind: str, size: int) -> bool:
    """The one rule for which groups a gate may cut: a prompt's first-stage group with pairs to compare
    (the gate stage opens only these; the rollout stage refuses a cut of any other)."""
    return kind in FIRST_STAGE_KINDS and size >= 2


def is_zero_variance(rewards: Sequence[float]) -> bool:
    """Every rollout got the same reward, so the group carries no GRPO gradient (an empty group too)."""
    return len(rewards) == 0 or max(rewards) == min(rewards)


def zero_variance_label(rewards: Sequence[float]) -> bool | None:
    """A group's label for a gate's precision / recall, the one rule online (shadow) and offline
    (calibration): whether its complete rollouts' rewards are all equal; None (unlabelled) with fewer than
    two complete rewards, where there is no pair to compare."""
    return is_zero_variance(rewards) if len(rewards) >= 2 else None


def label_rewards(result: GroupResult) -> list[float]:
    """Rewards of the trajectories that ended by themselves: a cut or failed rollout's partial reward is
    no label (for filters, shadow labels, allocator histories)."""
    return [t.reward for t in result.trajectories if t.status == TrajectoryStatus.COMPLETE]


@dataclass(slots=True)
class _Prompt:
    rewards: list[float]
    data: object
    members: list[int]
    extendable: bool


@dataclass
class MergedOutcomes:
    """Rewards of each prompt's merged group, settled when no later group can extend it any more.

    `open_root(gid, kind)` starts a prompt at its first-stage group, `open_child(gid, parent)` attaches a
    later group to it, and `add(gid, rewards)` adds a finished group's complete-trajectory rewards to its
    root. A plain `group` root is settled (handed to `on_settled(rewards, data)`) as soon as its rewards
    are in; an extendable one (pilot, explore) once `window` newer roots have opened since it (the
    allocators extend a prompt within a few groups), or at `flush()`. Memory is bounded by `window`.
    """

    on_settled: Callable[[list[float], object], None]
    window: int = 256
    _roots: OrderedDict[int, _Prompt] = field(default_factory=OrderedDict)
    _root_of: dict[int, int] = field(default_factory=dict)

    def open_root(self, group_id: int, kind: str = "group", data: object = None) -> None:
        self._roots[group_id] = _Prompt([], data, [group_id], kind in EXTENDABLE_KINDS)
        self._root_of[group_id] = group_id
        while len(self._roots) > self.window:
            self._settle(next(iter(self._roots)))

    def open_child(self, group_id: int, parent: int | None) -> bool:
        """A later group of a prompt (commit, rescue): False if its root is unknown or settled."""
        root = self._root_of.get(parent) if parent is not None else None
        if root is None or root not in self._roots:
            return False
        self._root_of[group_id] = root
        self._roots[root].members.append(group_id)
        return True

    def add(self, group_id: int, rewards: Sequence[float]) -> None:
        root = self._root_of.get(group_id)
        if root is not None and root in self._roots:
            self._roots[root].rewards.extend(rewards)
            if not self._roots[root].extendable:
                self._settle(root)

    def discard(self, group_id: int) -> None:
        """A root that will never get a label (its group was cut): forget it without settling."""
        root = self._root_of.get(group_id)
        if root == group_id and root in self._roots:
            for gid in self._roots.pop(root).members:
                del self._root_of[gid]

    def set_data(self, group_id: int, data: object) -> None:
        root = self._root_of.get(group_id)
        if root is not None and root in self._roots:
            self._roots[root].data = data

    def flush(self) -> None:
        for root in list(self._roots):
            self._settle(root)

    def _settle(self, root: int) -> None:
        prompt = self._roots.pop(root)
        for gid in prompt.members:
            del self._root_of[gid]
        self.on_settled(prompt.rewards, prompt.data)
