"""Paired per-seed statistics: an arm against the baseline arm, seed by seed, with Student-t intervals.

Seeds are the unit of replication: seed s of every arm shares the task order, the warm start and the
machine's drift, so each seed gives one paired value and the statistic is computed on those values:

- a ratio is the geometric mean of the per-seed ratios arm / baseline: the mean of the per-seed log-ratios,
  exponentiated, with the Student-t interval of that mean exponentiated (a ratio of means would let one seed
  with ten times the others' cost decide it);
- a difference is the mean of the per-seed differences arm - baseline, with its Student-t interval.

Student-t on the per-seed values holds its level with few seeds when they are roughly normal (the percentile
bootstrap this replaced covered 85 % at n = 5: tests/pipeline/ab/test_stats.py simulates n = 5 and n = 10).
One pair gives the point and no interval (`kind` "point"). Values missing in either arm drop that seed, and
a ratio also drops a seed where either value is not positive (its log-ratio is undefined): `seeds` names the
pairs used. All functions here are pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np

from pipeline.student_t import t_interval


@dataclass(frozen=True)
class PairedInterval:
    estimate: float
    """Statistic of the paired seeds' values (geometric mean ratio, or mean difference)."""
    ci_low: float | None
    ci_high: float | None
    """None with a single pair (no spread to take an interval from)."""
    seeds: tuple[int, ...]
    """The seeds both arms have a value for (the pairs used)."""
    kind: str = "t"
    """What [ci_low, ci_high] is: "t" (Student-t on the per-seed values) or "point" (one pair: no interval)."""
    level: float = 0.95

    @property
    def n_pairs(self) -> int:
        return len(self.seeds)

    def describe(self) -> str:
        """What the bounds are, in words a report prints beside them."""
        return describe_interval(self.kind, self.n_pairs, self.level)

    def excludes(self, null: float) -> bool:
        """Whether the interval lies wholly on one side of `null` (1 for a ratio, 0 for a difference)."""
        return self.ci_low is not None and self.ci_high is not None and not self.ci_low <= null <= self.ci_high

    def to_json(self) -> dict[str, object]:
        return {"estimate": self.estimate, "ci_low": self.ci_low, "ci_high": self.ci_high, "n_pairs": self.n_pairs,
                "seeds": list(self.seeds), "kind": self.kind, "level": self.level}


def describe_interval(kind: str, n: int, level: float = 0.95) -> str:
    """'95 % Student-t interval, n = 5', or 'one seed, no interval'."""
    if kind == "point":
        return "one seed, no interval"
    if kind == "range":  # reports written before the Student-t intervals
        return f"range over {n} seed{'s' if n != 1 else ''}"
    return f"{level:.0%} Student-t interval, n = {n}".replace("%", " %")


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def pair_by_seed(
    baseline: Mapping[int, float | None], arm: Mapping[int, float | None]
) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """Seeds with a finite value in both arms, and the two value vectors in that seed order ([n], [n])."""
    seeds = tuple(sorted(s for s in baseline.keys() & arm.keys() if _finite(baseline[s]) and _finite(arm[s])))
    return seeds, np.array([baseline[s] for s in seeds], dtype=float), np.array([arm[s] for s in seeds], dtype=float)


def _paired(estimate_values: np.ndarray, seeds: tuple[int, ...], level: float, back: bool) -> PairedInterval:
    mean, low, high = t_interval(estimate_values.tolist(), level)
    f = math.exp if back else float
    return PairedInterval(f(mean), None if low is None else f(low), None if high is None else f(high), seeds,
                          "t" if low is not None else "point", level)


def log_ratios(baseline: Mapping[int, float | None], arm: Mapping[int, float | None]) -> dict[int, float]:
    """log(arm / baseline) of every seed where both values are finite and positive."""
    seeds, b, a = pair_by_seed(baseline, arm)
    return {s: math.log(y / x) for s, x, y in zip(seeds, b, a, strict=True) if x > 0 and y > 0}


def paired_ratio(
    baseline: Mapping[int, float | None], arm: Mapping[int, float | None], *, level: float = 0.95
) -> PairedInterval | None:
    """Geometric mean of the per-seed ratios arm / baseline, with the Student-t interval of the mean log-ratio
    exponentiated. None when no seed has a positive value in both arms (a ratio to zero says nothing)."""
    logs = log_ratios(baseline, arm)
    if not logs:
        return None
    seeds = tuple(sorted(logs))
    return _paired(np.array([logs[s] for s in seeds]), seeds, level, back=True)


def paired_difference(
    baseline: Mapping[int, float | None], arm: Mapping[int, float | None], *, level: float = 0.95
) -> PairedInterval | None:
    """Mean of the per-seed differences arm - baseline with its Student-t interval (None: no pairs)."""
    seeds, b, a = pair_by_seed(baseline, arm)
    if not seeds:
        return None
    return _paired(a - b, seeds, level, back=False)


def mean_sd(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof 1) of the finite values; None where undefined."""
    finite = [v for v in values if _finite(v)]
    if not finite:
        return None, None
    mean = sum(finite) / len(finite)
    if len(finite) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
