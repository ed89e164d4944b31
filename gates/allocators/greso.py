"""GRESO: pre-rollout probabilistic skipping of prompts that were recently zero-variance (allocators.md §2).

Per prompt, only the trailing run of all-correct groups `z_easy` and of all-wrong groups `z_hard` is kept
(§2d; a mixed group resets both). A prompt is skipped with probability `1 − max(p^z, 0.01)` using the
exploration rate of its run (`greso_skip`). Easy and hard rates are adapted once per learner update toward
target zero-variance rates (`greso_controller`, none in the first pass over the data), and finished groups
still pass DAPO's filter (GRESO trains only on non-zero-variance groups).

Streaming mapping (§2e): the dataloader pass becomes a reshuffled task cycle ("epoch" = pass index); a
skipped prompt waits for the next pass. The adaptive batch size (`abs_next_batch`) becomes the in-flight
target: new prompts are admitted while fewer than `b_next` groups are in flight, with
`remaining = B·(1 + lookahead) − ready` and `zv` a running zero-variance rate over about the last B groups.
A cut group (the in-flight gate stopped it) adds nothing to the prompt's runs: its outcome is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import msgspec

from pipeline.messages import GroupResult

from ._common import YieldPacer, rewards_of, successes_of, trainable
from .base import Admission, AllocatorBase, AllocatorContext
from .dapo import dapo_keep

KEEP_FLOOR = 0.01


def greso_skip_probability(p: float, z: int, floor: float = KEEP_FLOOR) -> float:
    """Skip probability after a trailing run of `z` zero-variance groups: `1 − max(p^z, floor)`; 0 for z = 0."""
    return 1.0 - max(p**z, floor) if z > 0 else 0.0


def greso_skip(
    z_easy: int,
    z_hard: int,
    p_easy: float,
    p_hard: float,
    draw: Callable[[], float],
    floor: float = KEEP_FLOOR,
) -> bool:
    """GRESO's `filter_examples_all_probabilistic` on run counters: skip the prompt now?

    `draw()` returns a uniform [0, 1) number. A prompt with no zero-variance run is never skipped; the
    hard test is reached only when the last group was all-wrong (z_easy > 0 excludes it).
    """
    if z_easy > 0:
        return draw() < greso_skip_probability(p_easy, z_easy, floor)
    if z_hard > 0:
        return draw() < greso_skip_probability(p_hard, z_hard, floor)
    return False


def update_runs(z_easy: int, z_hard: int, successes: list[bool]) -> tuple[int, int]:
    """The trailing runs after one more group: all-correct extends z_easy, all-wrong z_hard, mixed resets."""
    if successes and all(successes):
        return z_easy + 1, 0
    if not any(successes):
        return 0, z_hard + 1
    return 0, 0


def greso_controller(
    p: float, rate: float, target: float, epoch: int, step: float = 0.01, lo: float = 0.05, hi: float = 0.95
) -> float:
    """One exploration-rate update: too many zero-variance groups (rate >= target) → skip more (p − step),
    else p + step; clipped to [lo, hi]; no update in epoch 0."""
    if epoch == 0:
        return p
    return min(hi, max(lo, p - step if rate >= target else p + step))


def abs_next_batch(
    remaining: int, zv: float, b0: int, floor: int = 64, safety: float = 1.25
) -> tuple[int, bool]:
    """GRESO's adaptive batch size: prompts to roll out next for `remaining` non-zero-variance groups.

    Returns `(b_next, last)` with `est = int(remaining / (1 − zv) · safety)`, `last = est <= b0` and
    `b_next = max(min(est, b0), floor)`. Deviation: zv is capped at 0.99 (the code divides by zero at 1).
    """
    est = int(remaining / (1.0 - min(zv, 0.99)) * safety)
    return max(min(est, b0), floor), est <= b0


class GresoAllocator(AllocatorBase):
    name = "greso"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        p_easy: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
        """Initial keep probability per all-correct observation."""
        p_hard: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
        """Initial keep probability per all-wrong observation."""
        target_zero_variance: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.25
        """Total zero-variance target; 1/3 of it for easy groups, 2/3 for hard ones."""
        step: Annotated[float, msgspec.Meta(ge=0)] = 0.01
        min_p: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.05
        max_p: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.95
        keep_floor: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.01
        """Minimum keep probability (max skip probability 0.99)."""
        safety: Annotated[float, msgspec.Meta(ge=1)] = 1.25
        """ABS safety factor."""
        sampling_batch_groups: Annotated[int, msgspec.Meta(ge=0)] = 0
        """ABS cap b0 on groups in flight; 0 = ceil(1.5·B) (the code's 384 / 256)."""
        min_batch_groups: Annotated[int, msgspec.Meta(ge=0)] = 0
        """ABS floor on groups in flight; 0 = max(1, B // 4) (the code's 64 / 256)."""
        lookahead_batches: Annotated[float, msgspec.Meta(ge=0)] = 1.0

        def __post_init__(self) -> None:
            if self.min_p > self.max_p:
                raise ValueError(f"min_p ({self.min_p}) must be <= max_p ({self.max_p})")

    def __init__(self, options: Options, ctx: AllocatorContext) -> None:
        super().__init__(options, ctx)
        self._opts = options
        self._pacer = YieldPacer(ctx.batch_groups, options.lookahead_batches)
        self._b0 = options.sampling_batch_groups or math.ceil(1.5 * ctx.batch_groups)
        self._floor = max(1, options.min_batch_groups or ctx.batch_groups // 4)
        self.p_easy = options.p_easy
        self.p_hard = options.p_hard
        self._runs: dict[str, list[int]] = {}
        """task id -> [z_easy, z_hard, groups of it observed]."""
        self._counts = {"easy": 0, "hard": 0, "total": 0}
        """Groups observed since the last learner update (controller input)."""

    def in_flight_target(self) -> int:
        """ABS in streaming: groups to keep in flight for the groups still wanted."""
        need = self._pacer.need()
        if need == 0:
            return 0
        return abs_next_batch(need, 1.0 - self._pacer.yield_rate, self._b0, self._floor, self._opts.safety)[0]

    def next_admission(self, free_slots: int) -> Admission | None:
        in_flight = len(self.in_flight)
        if in_flight and in_flight >= self.in_flight_target():  # never refuse with nothing in flight
            return None
        if not self.fits(self.ctx.group_size, free_slots):
            return None
        # Skipping is probabilistic with a 1% keep floor, so this ends quickly; the cap keeps it finite.
        for _ in range(100 * len(self.ctx.tasks)):
            task_id = self.next_task()
            z_easy, z_hard, _ = self._runs.get(task_id, (0, 0, 0))
            if not greso_skip(
                z_easy, z_hard, self.p_easy, self.p_hard, self.rng.random, self._opts.keep_floor
            ):
                break
            self.ledger.skipped()
        return Admission(task_id=task_id, size=self.ctx.group_size)

    def decide(self, result: GroupResult, admission: Admission) -> list[GroupResult]:
        if not trainable(result):
            return self.drop()
        successes = successes_of(result)
        run = self._runs.setdefault(result.task_id, [0, 0, 0])
        run[0], run[1] = update_runs(run[0], run[1], successes)
        run[2] += 1
        self._counts["easy"] += int(all(successes))
        self._counts["hard"] += int(not any(successes))
        self._counts["total"] += 1
        keep = dapo_keep(rewards_of(result))
        self._pacer.observe(keep)
        if not keep:
            return self.drop()
        self._pacer.emitted()
        return [self.train(result)]

    def on_update(self, version: int) -> None:
        self._pacer.updated()
        total = self._counts["total"]
        if total:
            o = self._opts
            t_easy, t_hard = o.target_zero_variance / 3, 2 * o.target_zero_variance / 3
            epoch = max(self.epoch, 0)
            self.p_hard = greso_controller(
                self.p_hard, self._counts["hard"] / total, t_hard, epoch, o.step, o.min_p, o.max_p
            )
            self.p_easy = greso_controller(
                self.p_easy, self._counts["easy"] / total, t_easy, epoch, o.step, o.min_p, o.max_p
            )
        self._counts = dict.fromkeys(self._counts, 0)

    def extra_statistics(self) -> Mapping[str, float]:
        return {
            "allocator/p_easy": self.p_easy,
            "allocator/p_hard": self.p_hard,
            "allocator/in_flight_target": float(self.in_flight_target()),
            "allocator/prompts_tracked": float(len(self._runs)),
        }

    def extra_state(self) -> dict[str, Any]:
        return {
            "pacer": self._pacer.state_dict(),
            "p_easy": self.p_easy,
            "p_hard": self.p_hard,
            "runs": {k: list(v) for k, v in self._runs.items()},
            "counts": dict(self._counts),
        }

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._pacer.load_state_dict(state["pacer"])
        self.p_easy = float(state["p_easy"])
        self.p_hard = float(state["p_hard"])
        self._runs = {k: [int(x) for x in v] for k, v in state["runs"].items()}
        self._counts = {k: int(v) for k, v in state["counts"].items()}
