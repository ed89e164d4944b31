"""VIP: variance-informed predictive allocation (allocators.md §5). A RECONSTRUCTION: VIP's code is unreleased.

What follows the paper (as far as §5 could verify it): a GP predicts each prompt's success probability p
from recent outcomes of similar prompts; a rollout budget C is spread over the prompts of a batch to
minimise the summed gradient variance `Σ_q v_q · h(n_q)` with `v_q = E[p(1 − p)]` under the prediction and
`L <= n_q <= U`; h is RLOO's `1/(n − 1)` or Dr.GRPO's `(n − 1)/n²`.

What is reconstructed (§5a, tagged [I] there): prompt features come from `Task.features` and `Task.family`
(not MiniLM embeddings); the GP is exact regression on empirical logits (`_gp.py`, §5a option ii) rather than
a Laplace/EP classifier; drift is handled by decaying every prompt's (k, n) by `decay` per learner update and
keeping the `max_observed` most recently seen prompts; the integer allocation is the greedy marginal rule
(`greedy_allocation`), which is exact for separable convex objectives, instead of bisection + rounding.

Streaming mapping (§5e): each round draws `window` prompts, predicts them, allocates
`C = round(budget_per_prompt · window)` rollouts, and hands the groups out one at a time (the first queued
group that fits the free slots). Every uncut group trains; zero-variance ones are left to the learner's
`drop_zero_variance`, as for `uniform`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from pipeline.messages import GroupResult

from ._common import successes_of, trainable
from ._gp import (
    expected_bernoulli_variance,
    gp_posterior,
    logit_observation,
    median_bandwidth,
    rbf_kernel,
    task_features,
)
from .base import Admission, AllocatorBase, AllocatorContext


def h_rloo(n: int) -> float:
    """RLOO per-prompt variance factor `1/(n − 1)` (n >= 2)."""
    return 1.0 / (n - 1)


def h_dr_grpo(n: int) -> float:
    """Dr.GRPO per-prompt variance factor `(n − 1)/n²` (convex and decreasing for n >= 3)."""
    return (n - 1) / n**2


VARIANCE_FACTORS: dict[str, tuple[Callable[[int], float], int]] = {
    "rloo": (h_rloo, 2),
    "dr_grpo": (h_dr_grpo, 3),
}
"""estimator -> (h, smallest L for which h is convex and decreasing)."""


def greedy_allocation(
    v: Sequence[float], budget: int, lo: int, hi: int, h: Callable[[int], float]
) -> list[int]:
    """Minimise `Σ v_q h(n_q)` s.t. `Σ n_q = budget`, `lo <= n_q <= hi`, over integers.

    Starts every prompt at `lo` and gives each further unit to the prompt with the largest marginal gain
    `v_q (h(n_q) − h(n_q + 1))` (ties: larger v, then lower index). Exact when h is convex and decreasing
    on [lo, hi] (gains never grow), and monotone: `v_i > v_j` implies `n_i >= n_j`.

    Raises:
        ValueError: the budget cannot be met within the bounds.
    """
    if not 1 <= lo <= hi or not lo * len(v) <= budget <= hi * len(v):
        raise ValueError(f"budget {budget} not reachable for {len(v)} prompts within [{lo}, {hi}]")
    n = [lo] * len(v)
    heap = [(-vq * (h(lo) - h(lo + 1)), -vq, q) for q, vq in enumerate(v) if lo < hi]
    heapq.heapify(heap)
    for _ in range(budget - lo * len(v)):
        _, neg_v, q = heapq.heappop(heap)
        n[q] += 1
        if n[q] < hi:
            heapq.heappush(heap, (neg_v * (h(n[q]) - h(n[q] + 1)), neg_v, q))
    return n


class VipAllocator(AllocatorBase):
    name = "vip"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        estimator: Literal["rloo", "dr_grpo"] = "rloo"
        """Which gradient-variance formula h(n) to minimise."""
        window: Annotated[int, msgspec.Meta(ge=0)] = 0
        """Prompts per allocation round; 0 = B."""
        budget_per_prompt: Annotated[float, msgspec.Meta(ge=0)] = 0.0
        """Mean rollouts per prompt n̄ (round budget C = n̄ · window); 0 = G."""
        min_rollouts: Annotated[int, msgspec.Meta(ge=0)] = 0
        """L; 0 = max(G // 4, 2 for rloo, 3 for dr_grpo)."""
        max_rollouts: Annotated[int, msgspec.Meta(ge=0)] = 0
        """U; 0 = 2·G."""
        prior_var: Annotated[float, msgspec.Meta(gt=0)] = 1.0
        """GP signal variance on the logit scale."""
        bandwidth: Annotated[float, msgspec.Meta(ge=0)] = 0.0
        """RBF length scale; 0 = median heuristic over the task features."""
        decay: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.8
        """Forgetting factor on every prompt's (k, n) per learner update."""
        max_observed: Annotated[int, msgspec.Meta(ge=1)] = 128
        """Most recently observed prompts the GP conditions on."""

    def __init__(self, options: Options, ctx: AllocatorContext) -> None:
        super().__init__(options, ctx)
        self._opts = options
        g = ctx.group_size
        self._h, l_min = VARIANCE_FACTORS[options.estimator]
        self.lo = options.min_rollouts or max(g // 4, l_min)
        self.hi = options.max_rollouts or 2 * g
        self.n_bar = options.budget_per_prompt or float(g)
        self.window = options.window or ctx.batch_groups
        if self.lo < l_min:
            raise ValueError(f"vip: min_rollouts must be >= {l_min} for estimator {options.estimator!r}")
        if not self.lo <= self.n_bar <= self.hi:
            raise ValueError(
                f"vip: need min_rollouts ({self.lo}) <= budget_per_prompt ({self.n_bar}) "
                f"<= max_rollouts ({self.hi})"
            )
        self._index = {t.task_id: i for i, t in enumerate(ctx.tasks)}
        self._x = task_features(ctx.tasks)  # [T, D]
        self._bandwidth = options.bandwidth or median_bandwidth(self._x)
        self._obs: dict[str, list[float]] = {}
        """task id -> [k, n], decayed; insertion order = least recently observed first."""
        self._queue: list[tuple[str, int, float]] = []
        """(task id, group size, predicted variance) of the current round, in hand-out order."""
        self._rounds = 0

    # -- prediction

    def predict(self, task_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """GP posterior (mean, variance) of the latent logit success of each task."""
        observed = list(self._obs.items())
        k_tot = sum(k for k, _ in self._obs.values())
        n_tot = sum(n for _, n in self._obs.values())
        prior_mean = math.log((k_tot + 0.5) / (n_tot - k_tot + 0.5))
        pairs = [logit_observation(k, n) for _, (k, n) in observed]
        y = np.array([p[0] for p in pairs])
        noise = np.array([p[1] for p in pairs])
        x_o = self._x[[self._index[t] for t, _ in observed]]  # [O, D]
        x_s = self._x[[self._index[t] for t in task_ids]]  # [S, D]
        s2 = self._opts.prior_var
        k_oo = rbf_kernel(x_o, x_o, self._bandwidth, s2)
        k_so = rbf_kernel(x_s, x_o, self._bandwidth, s2)
        return gp_posterior(k_oo, k_so, np.full(len(task_ids), s2), y, noise, prior_mean)

    def _new_round(self) -> None:
        task_ids = [self.next_task() for _ in range(self.window)]
        mean, var = self.predict(task_ids)
        v = expected_bernoulli_variance(mean, var)
        budget = round(self.n_bar * len(task_ids))
        sizes = greedy_allocation(v.tolist(), budget, self.lo, self.hi, self._h)
        self._queue = [(t, n, float(vq)) for t, n, vq in zip(task_ids, sizes, v, strict=True)]
        self._rounds += 1

    # -- the allocator protocol

    def next_admission(self, free_slots: int) -> Admission | None:
        if not self._queue:
            self._new_round()
        for i, (task_id, size, _) in enumerate(self._queue):
            if size <= free_slots:
                del self._queue[i]
                return Admission(task_id, size)
        if self.in_flight:
            return None  # the slots of the groups in flight will come back
        task_id, size, _ = self._queue.pop(0)  # the group is larger than every slot: shrink it
        if free_slots < 1:
            raise ValueError("vip allocator: no rollout slots at all")
        return Admission(task_id, free_slots)

    def decide(self, result: GroupResult, admission: Admission) -> list[GroupResult]:
        if not trainable(result):
            return self.drop()
        successes = successes_of(result)
        k, n = self._obs.pop(result.task_id, [0.0, 0.0])
        self._obs[result.task_id] = [k + sum(successes), n + len(successes)]
        while len(self._obs) > self._opts.max_observed:
            del self._obs[next(iter(self._obs))]
        return [self.train(result)]

    def on_update(self, version: int) -> None:
        d = self._opts.decay
        self._obs = {t: [k * d, n * d] for t, (k, n) in self._obs.items()}

    def extra_statistics(self) -> Mapping[str, float]:
        return {
            "allocator/rounds": float(self._rounds),
            "allocator/prompts_observed": float(len(self._obs)),
            "allocator/queued_groups": float(len(self._queue)),
            "allocator/mean_group_size": self.ledger.counts["rollouts_spent"]
            / max(self.ledger.counts["groups_admitted"], 1),
        }

    def extra_state(self) -> dict[str, Any]:
        return {
            "observations": [[t, k, n] for t, (k, n) in self._obs.items()],
            "queue": [list(entry) for entry in self._queue],
            "rounds": self._rounds,
        }

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._obs = {t: [float(k), float(n)] for t, k, n in state["observations"]}
        self._queue = [(t, int(n), float(v)) for t, n, v in state["queue"]]
        self._rounds = int(state["rounds"])
