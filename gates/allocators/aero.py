"""AERO: adaptive efficient rollout optimisation (allocators.md §3). Largely a RECONSTRUCTION: no official
code exists; §3 pieces it together from the abstract, reviews and one third-party reimplementation.

Per prompt: explore `n_explore` rollouts. If none succeeded, rescue with `n_extra`-sized follow-ups until
the first success (rollouts after it in the same chunk are discarded, as in the reimplementation) or
`n_total` rollouts in all. The finished group (explore ∪ rescues) is then curated (`aero_curate`):

* dead zone (all correct, or all wrong after rescue): AERO replaces the empirical baseline by the Beta
  posterior mean `(c + α0)/(n + α0 + β0)` (`beta_posterior_mean`) so advantages stay non-zero. rollcut's
  learner computes group-relative advantages from the rewards alone and the wire `GroupResult` carries no
  baseline, so such a group would train with zero advantage: it is dropped, and its posterior is reported
  (`allocator/dead_zone_baseline`). Emitting it needs a `baseline` field on `GroupResult` (proposed).
* low success (u < u_split): rejection sampling keeps all c correct and `min(k·c, #wrong)` wrong rollouts
  drawn uniformly at random (k = 1: balanced), cutting training compute.
* otherwise: every rollout trains.

Streaming mapping (§3e): rescue follow-ups are served before new prompts; a follow-up that does not fit
waits for slots. A cut explore or rescue group drops the prompt. A checkpoint keeps the prompts waiting
for a rescue (their rollouts are done), not those with a group in flight. Reconstructed [I]: the stop-at-first-
success truncation, k, the dead-zone rule (per group, not a persistent per-prompt posterior).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from pipeline.messages import GroupResult

from ._common import merge_groups, result_from_state, result_to_state, subset, successes_of, trainable
from .base import Admission, AllocatorBase, AllocatorContext

DEAD_ZONE, REJECTION, KEEP_ALL = "dead_zone", "rejection", "keep_all"


def rescue_size(n_done: int, successes: int, n_total: int, n_extra: int) -> int:
    """Rollouts for the next rescue chunk: `min(n_extra, n_total − n_done)` while nothing succeeded, else 0."""
    if successes > 0 or n_done >= n_total:
        return 0
    return min(n_extra, n_total - n_done)


def first_success_prefix(successes: Sequence[bool]) -> int:
    """How many rollouts of a rescue chunk to keep: up to and including the first success (all if none)."""
    for i, s in enumerate(successes):
        if s:
            return i + 1
    return len(successes)


def beta_posterior_mean(successes: int, n: int, alpha0: float = 1.0, beta0: float = 1.0) -> float:
    """Posterior mean success rate under a Beta(α0, β0) prior: `(c + α0) / (n + α0 + β0)`."""
    return (successes + alpha0) / (n + alpha0 + beta0)


def aero_curate(
    successes: Sequence[bool], rng: random.Random, k: float = 1.0, u_split: float = 0.5
) -> tuple[list[int], str]:
    """AERO's Stage II on a finished group: (indices of the rollouts that train, which stratum).

    Dead zone (c = 0 or c = n): no indices, DEAD_ZONE. u = c/n < u_split: every correct rollout and
    `min(int(k·c), #wrong)` wrong ones drawn uniformly, REJECTION. Otherwise every rollout, KEEP_ALL.
    """
    n, c = len(successes), sum(successes)
    if c == 0 or c == n:
        return [], DEAD_ZONE
    if c / n >= u_split:
        return list(range(n)), KEEP_ALL
    correct = [i for i, s in enumerate(successes) if s]
    wrong = [i for i, s in enumerate(successes) if not s]
    return sorted(correct + rng.sample(wrong, min(int(k * c), len(wrong)))), REJECTION


@dataclass(slots=True)
class _Visit:
    task_id: str
    parts: list[GroupResult] = field(default_factory=list)

    def successes(self) -> list[bool]:
        return [s for part in self.parts for s in successes_of(part)]


class AeroAllocator(AllocatorBase):
    name = "aero"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        n_explore: Annotated[int, msgspec.Meta(ge=0)] = 0
        """Stage I rollouts per prompt; 0 = G."""
        n_total: Annotated[int, msgspec.Meta(ge=0)] = 0
        """Rollout budget per prompt including rescues (N_budget); 0 = 2 · n_explore (16 at G = 8)."""
        n_extra: Annotated[int, msgspec.Meta(ge=1)] = 2
        """Rollouts per rescue chunk."""
        u_split: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
        """Below this success rate, surplus wrong rollouts are rejected."""
        k: Annotated[float, msgspec.Meta(ge=0)] = 1.0
        """Wrong rollouts kept per correct one under rejection."""
        prior_alpha: Annotated[float, msgspec.Meta(gt=0)] = 1.0
        prior_beta: Annotated[float, msgspec.Meta(gt=0)] = 1.0

    def __init__(self, options: Options, ctx: AllocatorContext) -> None:
        super().__init__(options, ctx)
        self._opts = options
        self.n_explore = options.n_explore or ctx.group_size
        self.n_total = options.n_total or 2 * self.n_explore
        if self.n_total < self.n_explore:
            raise ValueError(f"aero: n_total ({self.n_total}) < n_explore ({self.n_explore})")
        self._visits: dict[int, _Visit] = {}
        """Prompts being rolled out, by the group id of their explore group."""
        self._rescues: deque[int] = deque()
        """Explore group ids waiting for rescue slots, first come first served."""
        self._strata = {DEAD_ZONE: 0, REJECTION: 0, KEEP_ALL: 0, "rescued": 0, "rescue_successes": 0}
        self._discarded = 0
        self._baseline_sum = 0.0

    def next_admission(self, free_slots: int) -> Admission | None:
        if self._rescues:
            root = self._rescues[0]
            visit = self._visits[root]
            size = rescue_size(
                sum(len(p.trajectories) for p in visit.parts), 0, self.n_total, self._opts.n_extra
            )
            if not self.fits(size, free_slots):
                return None
            self._rescues.popleft()
            return Admission(visit.task_id, size, kind="rescue", parent=root)
        if not self.fits(self.n_explore, free_slots):
            return None
        return Admission(self.next_task(), self.n_explore, kind="explore")

    def on_admitted(self, group_id: int, admission: Admission) -> None:
        super().on_admitted(group_id, admission)
        if admission.kind == "explore":
            self._visits[group_id] = _Visit(admission.task_id)

    def decide(self, result: GroupResult, admission: Admission) -> list[GroupResult]:
        root = result.group_id if admission.parent is None else admission.parent
        if not trainable(result):
            del self._visits[root]
            return self.drop()
        visit = self._visits[root]
        if admission.kind == "rescue":
            kept = first_success_prefix(successes_of(result))
            self._discarded += len(result.trajectories) - kept
            result = subset(result, range(kept))
        visit.parts.append(result)
        successes = visit.successes()
        if rescue_size(len(successes), sum(successes), self.n_total, self._opts.n_extra):
            self._strata["rescued"] += admission.kind == "explore"
            self._rescues.append(root)
            return []
        del self._visits[root]
        return self._finish(visit, successes)

    def _finish(self, visit: _Visit, successes: list[bool]) -> list[GroupResult]:
        if len(visit.parts) > 1 and any(successes):
            self._strata["rescue_successes"] += 1
        indices, stratum = aero_curate(successes, self.rng, self._opts.k, self._opts.u_split)
        self._strata[stratum] += 1
        self._discarded += len(successes) - len(indices)
        if stratum == DEAD_ZONE:
            o = self._opts
            self._baseline_sum += beta_posterior_mean(
                sum(successes), len(successes), o.prior_alpha, o.prior_beta
            )
            return self.drop()
        return [self.train(subset(merge_groups(*visit.parts), indices))]

    def extra_statistics(self) -> Mapping[str, float]:
        dead = self._strata[DEAD_ZONE]
        return {
            **{f"allocator/groups_{k}": float(v) for k, v in self._strata.items()},
            "allocator/rollouts_discarded": float(self._discarded),
            "allocator/dead_zone_baseline": self._baseline_sum / dead if dead else 0.0,
        }

    def pending_kept(self) -> int:
        return len(self._rescues)

    def extra_state(self) -> dict[str, Any]:
        return {
            "rescues": [
                {
                    "root": root,
                    "task_id": self._visits[root].task_id,
                    "parts": [result_to_state(p) for p in self._visits[root].parts],
                }
                for root in self._rescues
            ],
            "strata": dict(self._strata),
            "discarded": self._discarded,
            "baseline_sum": self._baseline_sum,
        }

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._strata = {k: int(v) for k, v in state["strata"].items()}
        self._discarded = int(state["discarded"])
        self._baseline_sum = float(state["baseline_sum"])
        self._rescues = deque(int(e["root"]) for e in state["rescues"])
        self._visits = {
            int(e["root"]): _Visit(e["task_id"], [result_from_state(p) for p in e["parts"]])
            for e in state["rescues"]
        }
