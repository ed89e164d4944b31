"""Pilot-Commit (allocators.md §4, databricks/pilot-commit `recipe/pc`): pilot, then commit if informative.

A fresh prompt gets `n_pilot` rollouts. Its pilot success rate m decides (`pilot_decision`, bounds
inclusive as in `filter_batch`): `p_lo <= m <= 1 − p_up` → commit `n_commit` more rollouts later; above
the band → too easy, dropped (and evicted for good when m >= `evict_threshold`); below → too hard, dropped
for now and piloted again in a later pass. The training group is pilot ∪ commit (the pilot optionally
down-sampled to `n_effective` rollouts by `max_variance_subset`), GRPO advantages over all of it.

Streaming mapping (§4e): two queues. Committed pilots wait in a commit queue (ordered by pilot reward std,
newest first, or randomly) and are served before any new pilot; a commit that does not fit the free slots
waits for slots rather than letting pilots overtake it. New pilots are admitted while
`ready + commits pending + pass-rate × pilots in flight < B · (1 + lookahead)`. Each learner update is one
optimizer step `s`; `flush_expired` then drops waiting pilots with `s − step_added > max_off_steps`.
Deviations: evictions apply at once, not at the epoch end (a prompt is drawn once per pass anyway), and
the commit queue is not cleared at the epoch end (the age bound already limits it). A cut pilot or commit
drops the prompt for this pass.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from pipeline.messages import GroupResult

from ._common import (
    YieldPacer,
    merge_groups,
    result_from_state,
    result_to_state,
    rewards_of,
    subset,
    successes_of,
    trainable,
)
from .base import Admission, AllocatorBase, AllocatorContext

COMMIT, TOO_EASY, TOO_HARD = "commit", "too_easy", "too_hard"


def pilot_decision(m: float, p_lo: float, p_up: float) -> str:
    """The band rule on a pilot success rate m: COMMIT iff `p_lo <= m <= 1 − p_up`, else TOO_EASY / TOO_HARD."""
    if m > 1.0 - p_up:
        return TOO_EASY
    if m < p_lo:
        return TOO_HARD
    return COMMIT


def should_evict(m: float, evict_threshold: float | None) -> bool:
    """Permanent eviction of a solved prompt: iff a threshold is set and m >= it (1.0: all pilots correct)."""
    return evict_threshold is not None and m >= evict_threshold


def flush_expired(steps_added: Mapping[int, int], step: int, max_off_steps: int) -> list[int]:
    """`ReplayBuffer.flush`: the keys whose entry is too old, i.e. `step − step_added > max_off_steps`."""
    return [key for key, added in steps_added.items() if step - added > max_off_steps]


def max_variance_subset(positive: Sequence[bool], m: int) -> list[int]:
    """Indices of a most-balanced subset of size m: m // 2 positives and the rest negatives, topping up
    from the other class when one runs short (the code's max-variance response down-sampling)."""
    pos = [i for i, p in enumerate(positive) if p]
    neg = [i for i, p in enumerate(positive) if not p]
    n_pos = min(m // 2, len(pos))
    n_neg = min(m - n_pos, len(neg))
    n_pos = min(m - n_neg, len(pos))
    return sorted(pos[:n_pos] + neg[:n_neg])


@dataclass(slots=True)
class _Pilot:
    task_id: str
    result: GroupResult
    step_added: int
    std: float


class PilotCommitAllocator(AllocatorBase):
    name = "pilot_commit"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        n_pilot: Annotated[int, msgspec.Meta(ge=0)] = 0
        """Pilot rollouts per prompt; 0 = max(2, G // 2)."""
        n_commit: Annotated[int, msgspec.Meta(ge=0)] = 0
        """Commit rollouts per surviving prompt; 0 = max(1, G − n_pilot)."""
        n_effective: Annotated[int, msgspec.Meta(ge=0)] = 0
        """Pilot rollouts kept in the training group (max-variance subset); 0 = all of them."""
        p_lo: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.125
        """diversity_threshold_lower: commit iff m >= p_lo ..."""
        p_up: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.25
        """diversity_threshold_upper: ... and m <= 1 − p_up."""
        evict_threshold: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = 1.0
        """exclude_threshold_upper: evict for good when m >= this; None = never."""
        max_off_steps: Annotated[int, msgspec.Meta(ge=0)] = 4
        """Learner updates a committed pilot may wait before it is flushed."""
        commit_order: Literal["max_variance", "random"] = "max_variance"
        lookahead_batches: Annotated[float, msgspec.Meta(ge=0)] = 1.0

        def __post_init__(self) -> None:
            if self.p_lo > 1.0 - self.p_up:
                raise ValueError(f"empty band: p_lo ({self.p_lo}) > 1 - p_up ({1.0 - self.p_up})")

    def __init__(self, options: Options, ctx: AllocatorContext) -> None:
        super().__init__(options, ctx)
        self._opts = options
        self.n_pilot = options.n_pilot or max(2, ctx.group_size // 2)
        self.n_commit = options.n_commit or max(1, ctx.group_size - self.n_pilot)
        self.n_effective = options.n_effective or self.n_pilot
        if self.n_effective > self.n_pilot:
            raise ValueError(f"pilot_commit: n_effective ({self.n_effective}) > n_pilot ({self.n_pilot})")
        self._n_tasks = len({t.task_id for t in ctx.tasks})
        self._pacer = YieldPacer(ctx.batch_groups, options.lookahead_batches)
        self._queue: dict[int, _Pilot] = {}
        """Committed pilots waiting for commit slots, by pilot group id."""
        self._committing: dict[int, _Pilot] = {}
        """Pilots whose commit group is in flight, by pilot group id."""
        self._evicted: set[str] = set()
        self._step = 0
        self._decisions = {COMMIT: 0, TOO_EASY: 0, TOO_HARD: 0, "expired": 0, "eviction_resets": 0}

    # -- admission

    def next_admission(self, free_slots: int) -> Admission | None:
        in_flight = len(self.in_flight)
        if self._queue:  # commits first
            pilot_id = self._next_commit()
            if not self.fits(self.n_commit, free_slots):
                return None
            pilot = self._queue.pop(pilot_id)
            self._committing[pilot_id] = pilot
            return Admission(pilot.task_id, self.n_commit, kind="commit", parent=pilot_id)
        pilots = sum(a.kind == "pilot" for a in self.in_flight.values())
        if not self._pacer.admit(pilots, sure=len(self._committing), in_flight=in_flight):
            return None
        if not self.fits(self.n_pilot, free_slots):
            return None
        return Admission(self._next_task(), self.n_pilot, kind="pilot")

    def _next_commit(self) -> int:
        if self._opts.commit_order == "random":
            return self.rng.choice(sorted(self._queue))
        return max(self._queue, key=lambda k: (self._queue[k].std, self._queue[k].step_added, -k))

    def _next_task(self) -> str:
        if len(self._evicted) >= self._n_tasks:  # everything solved: start over rather than stop
            self._evicted.clear()
            self._decisions["eviction_resets"] += 1
        while (task_id := self.next_task()) in self._evicted:
            pass
        return task_id

    # -- results

    def decide(self, result: GroupResult, admission: Admission) -> list[GroupResult]:
        if admission.kind == "pilot":
            self._on_pilot(result)
            return []
        assert admission.parent is not None
        pilot = self._committing.pop(admission.parent)
        if not trainable(result):
            return self._drop()
        self._pacer.observe(True)
        self._pacer.emitted()
        return [self.train(merge_groups(pilot.result, result))]

    def _on_pilot(self, result: GroupResult) -> None:
        if not trainable(result):
            self._drop()
            return
        successes = successes_of(result)
        m = sum(successes) / len(successes)
        if should_evict(m, self._opts.evict_threshold):
            self._evicted.add(result.task_id)
        decision = pilot_decision(m, self._opts.p_lo, self._opts.p_up)
        self._decisions[decision] += 1
        if decision != COMMIT:
            self._drop()
            return
        kept = subset(result, max_variance_subset(successes, self.n_effective))
        std = statistics.pstdev(rewards_of(result))
        self._queue[result.group_id] = _Pilot(result.task_id, kept, self._step, std)

    def _drop(self) -> list[GroupResult]:
        self._pacer.observe(False)
        return self.drop()

    def on_update(self, version: int) -> None:
        self._step += 1
        self._pacer.updated()
        steps = {k: p.step_added for k, p in self._queue.items()}
        for pilot_id in flush_expired(steps, self._step, self._opts.max_off_steps):
            del self._queue[pilot_id]
            self._decisions["expired"] += 1
            self._drop()

    # -- accounting and checkpoints

    def extra_statistics(self) -> Mapping[str, float]:
        return {
            **{f"allocator/pilots_{k}": float(v) for k, v in self._decisions.items()},
            "allocator/prompts_evicted": float(len(self._evicted)),
            "allocator/commit_queue": float(len(self._queue)),
            "allocator/step": float(self._step),
        }

    def pending_kept(self) -> int:
        return len(self._queue)

    def extra_state(self) -> dict[str, Any]:
        queue = [
            {
                "pilot_id": k,
                "task_id": p.task_id,
                "result": result_to_state(p.result),
                "step": p.step_added,
                "std": p.std,
            }
            for k, p in self._queue.items()
        ]
        return {
            "pacer": self._pacer.state_dict(),
            "queue": queue,
            "evicted": sorted(self._evicted),
            "step": self._step,
            "decisions": dict(self._decisions),
        }

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._pacer.load_state_dict(state["pacer"])
        self._queue = {
            int(e["pilot_id"]): _Pilot(
                e["task_id"], result_from_state(e["result"]), int(e["step"]), float(e["std"])
            )
            for e in state["queue"]
        }
        self._committing.clear()
        self._evicted = set(state["evicted"])
        self._step = int(state["step"])
        self._decisions = {k: int(v) for k, v in state["decisions"].items()}
