"""Offline gate calibration: replay recorded step streams of full (uncut) groups through any gate.

A `RecordedGroup` is one first-stage group rolled out to the end with nothing cut: its step stream in
arrival order, the tokens each step generated and each member's final reward and status. Replaying it
through a gate object (the same class the gate stage runs) says when the gate would have cut and what
that cut would have saved: every step of the group that arrived after the deciding event.

Threshold gates (cut iff the decision's `value` < tau, evaluated at fixed checkpoints, stopping at the
first cut) are replayed once with a tau that never cuts (`checkpoint_values`); every tau is then a pure
function of the recorded values (`first_cut`), so a whole grid costs one replay.

Labels: a positive is a zero-reward-variance group over its COMPLETE members only (failed members are
excluded); a group with fewer than two complete members has no label and counts only in the savings
(`pipeline.outcomes.zero_variance_label`: the online shadow ledger labels with the same function).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from pipeline.messages import RolloutFailed, StepEvent
from pipeline.outcomes import zero_variance_label

from .base import Gate


class RecordedGroup(msgspec.Struct, frozen=True, kw_only=True):
    """One group rolled out to the end (shadow: nothing cut)."""

    task_id: str
    seed: int
    events: list[StepEvent | RolloutFailed]
    """This group's step stream in arrival order."""
    tokens: list[list[int]]
    """[G][steps of member] tokens generated at each step."""
    rewards: list[float]
    """[G] final reward of each member."""
    complete: list[bool]
    """[G] True when the member's episode ended by itself (not failed)."""

    @property
    def size(self) -> int:
        return len(self.rewards)

    def label(self) -> bool | None:
        """True: zero reward variance over complete members; None: fewer than two complete members
        (`pipeline.outcomes.zero_variance_label`, the shadow ledger's rule too)."""
        return zero_variance_label([r for r, ok in zip(self.rewards, self.complete, strict=True) if ok])

    def lengths(self) -> list[int]:
        """[G] env steps of each member."""
        return [len(t) for t in self.tokens]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One evaluation of a threshold gate during replay."""

    event: int
    """Index into `RecordedGroup.events` of the event that triggered the evaluation."""
    k: int
    value: float


def checkpoint_values(gate: Gate, group: RecordedGroup, group_id: int = 0) -> list[Checkpoint]:
    """Replay `group` through `gate` (built so that it never cuts) and return every evaluation."""
    gate.open(group_id, group.size)
    out = []
    for i, event in enumerate(group.events):
        decision = gate.observe(msgspec.structs.replace(event, group_id=group_id))
        if decision is not None:
            if decision.cut:
                raise ValueError(f"{gate.name} cut during a never-cut replay (value {decision.value}): not a threshold gate")
            out.append(Checkpoint(i, decision.checkpoint, decision.value))
    gate.close(group_id)
    return out


def first_cut(checkpoints: Sequence[Checkpoint], tau: float, ks: Iterable[int] | None = None) -> int | None:
    """The event index at which a threshold gate with `tau` (restricted to checkpoints `ks`) cuts, or None."""
    allowed = None if ks is None else set(ks)
    for c in checkpoints:
        if (allowed is None or c.k in allowed) and c.value < tau:
            return c.event
    return None


def replay_cut(gate: Gate, group: RecordedGroup, group_id: int = 0) -> int | None:
    """Replay `group` through a real (cutting) gate: the event index of its first cut, or None."""
    gate.open(group_id, group.size)
    try:
        for i, event in enumerate(group.events):
            decision = gate.observe(msgspec.structs.replace(event, group_id=group_id))
            if decision is not None and decision.cut:
                return i
        return None
    finally:
        gate.close(group_id)


def saved_after(group: RecordedGroup, cut_event: int | None) -> tuple[int, int]:
    """(env steps, generated tokens) of the group that arrived after event `cut_event` (0, 0 if None)."""
    if cut_event is None:
        return 0, 0
    steps = tokens = 0
    for event in group.events[cut_event + 1 :]:
        if isinstance(event, StepEvent):
            steps += 1
            tokens += group.tokens[event.rollout_index][event.step_index]
    return steps, tokens


def oracle_saved(group: RecordedGroup, k: int) -> tuple[int, int]:
    """What cutting this group once every member has k steps (or ended) saves: steps beyond k of each member."""
    steps = sum(max(0, len(t) - k) for t in group.tokens)
    tokens = sum(sum(t[k:]) for t in group.tokens)
    return steps, tokens


@dataclass(frozen=True, slots=True)
class Score:
    """Precision / recall and savings of one gate setting over a set of recorded groups."""

    tp: int
    fp: int
    fn: int
    tn: int
    steps_saved: float
    """Fraction of all env steps of the groups that the cuts save."""
    tokens_saved: float
    oracle_steps_saved: float
    """Fraction saved if exactly the zero-variance groups were cut at the first checkpoint."""
    cost_ratio: float | None
    """Env steps per informative (mixed) group kept, gated / ungated: < 1 pays, counting the
    informative groups that false cuts throw away. None when no informative group survives."""

    @property
    def cuts(self) -> int:
        return self.tp + self.fp

    @property
    def precision(self) -> float | None:
        return self.tp / self.cuts if self.cuts else None

    @property
    def recall(self) -> float | None:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None


class Scorer:
    """Scores many settings over one set of groups: per-group labels and suffix costs computed once."""

    def __init__(self, groups: Sequence[RecordedGroup]) -> None:
        self.groups = list(groups)
        self.labels = [g.label() for g in self.groups]
        self.steps = sum(sum(g.lengths()) for g in self.groups)
        self.tokens = sum(sum(map(sum, g.tokens)) for g in self.groups)
        self._after: list[list[tuple[int, int]]] = []
        """[N][events] (steps, tokens) that arrived after each event."""
        for g in self.groups:
            suffix, steps, tokens = [], 0, 0
            for event in reversed(g.events):
                suffix.append((steps, tokens))
                if isinstance(event, StepEvent):
                    steps += 1
                    tokens += g.tokens[event.rollout_index][event.step_index]
            self._after.append(suffix[::-1])
        self._oracle: dict[int, int] = {}

    def oracle(self, k: int) -> int:
        if k not in self._oracle:
            self._oracle[k] = sum(oracle_saved(g, k)[0] for g, label in zip(self.groups, self.labels, strict=True) if label)
        return self._oracle[k]

    def score(self, cut_events: Sequence[int | None], oracle_k: int) -> Score:
        """Score the cut decisions `cut_events` [N] (one per group, None = kept) against the labels."""
        if len(self.groups) != len(cut_events):
            raise ValueError(f"{len(self.groups)} groups but {len(cut_events)} decisions")
        tp = fp = fn = tn = saved_steps = saved_tokens = 0
        for after, label, cut in zip(self._after, self.labels, cut_events, strict=True):
            if cut is not None:
                saved_steps += after[cut][0]
                saved_tokens += after[cut][1]
            if label is None:
                continue
            tp, fp = tp + (cut is not None and label), fp + (cut is not None and not label)
            fn, tn = fn + (cut is None and label), tn + (cut is None and not label)
        cost = None
        if tn and self.steps:
            cost = ((self.steps - saved_steps) / tn) / (self.steps / (fp + tn))
        return Score(tp, fp, fn, tn, saved_steps / max(1, self.steps), saved_tokens / max(1, self.tokens),
                     self.oracle(oracle_k) / max(1, self.steps), cost)


def score(groups: Sequence[RecordedGroup], cut_events: Sequence[int | None], oracle_k: int) -> Score:
    """Score the cut decisions `cut_events` [N] (one per group, None = kept) against the groups' labels."""
    return Scorer(groups).score(cut_events, oracle_k)
