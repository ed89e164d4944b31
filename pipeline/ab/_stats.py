"""Paired percentile bootstrap over seeds: an arm's mean against the baseline arm's, seed by seed.

Seeds are the unit of replication: seed s of every arm shares the task order, the warm start and the
machine's drift (the harness interleaves arms by seed), so a resample draws *seeds* with replacement and
takes both arms' values of each drawn seed together. Values missing in either arm drop that seed.

With n seeds there are at most C(2n-1, n) distinct resamples (10 for n = 3), and with n <= 4 the 95 %
percentile interval is simply [min, max] of the per-seed values (a seed drawn every time has probability
n^-(n-1) > 2.5 %): a range, not a confidence interval. So below `MIN_BOOTSTRAP_SEEDS` pairs the bounds are the
per-seed range and say so (`kind = "range"`); from 5 pairs on they are the paired percentile bootstrap
(`kind = "bootstrap"`). The report states n and the kind next to every interval (`PairedInterval.describe`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np

MIN_BOOTSTRAP_SEEDS = 5
"""Fewer paired seeds than this give the range over seeds instead of a bootstrap interval."""


@dataclass(frozen=True)
class PairedInterval:
    estimate: float
    """Statistic of the paired seeds' values (ratio of means, or mean difference)."""
    ci_low: float
    ci_high: float
    seeds: tuple[int, ...]
    """The seeds both arms have a value for (the pairs resampled)."""
    kind: str = "bootstrap"
    """What [ci_low, ci_high] is: "range" (min and max over the seeds) or "bootstrap" (paired percentile)."""
    level: float = 0.95

    @property
    def n_pairs(self) -> int:
        return len(self.seeds)

    def describe(self) -> str:
        """What the bounds are, in words a report prints beside them."""
        return describe_interval(self.kind, self.n_pairs, self.level)

    def to_json(self) -> dict[str, object]:
        return {"estimate": self.estimate, "ci_low": self.ci_low, "ci_high": self.ci_high, "n_pairs": self.n_pairs,
                "seeds": list(self.seeds), "kind": self.kind, "level": self.level}


def describe_interval(kind: str, n: int, level: float = 0.95) -> str:
    """'range over 3 seeds' or '95 % paired bootstrap interval, n = 6': never a confidence level for a range."""
    if kind == "range":
        return f"range over {n} seed{'s' if n != 1 else ''}"
    return f"{level:.0%} paired bootstrap interval, n = {n}".replace("%", " %")


def _interval(estimate: float, per_seed: np.ndarray, draws: np.ndarray, seeds: tuple[int, ...], level: float) -> PairedInterval:
    """The per-seed range below `MIN_BOOTSTRAP_SEEDS` pairs, else the percentile bounds of the resampled draws."""
    if len(seeds) < MIN_BOOTSTRAP_SEEDS:
        _bounds(draws, level)  # the level is checked whatever the n
        return PairedInterval(estimate, float(per_seed.min()), float(per_seed.max()), seeds, "range", level)
    low, high = _bounds(draws, level)
    return PairedInterval(estimate, low, high, seeds, "bootstrap", level)


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def pair_by_seed(
    baseline: Mapping[int, float | None], arm: Mapping[int, float | None]
) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """Seeds with a finite value in both arms, and the two value vectors in that seed order ([n], [n])."""
    seeds = tuple(sorted(s for s in baseline.keys() & arm.keys() if _finite(baseline[s]) and _finite(arm[s])))
    return seeds, np.array([baseline[s] for s in seeds], dtype=float), np.array([arm[s] for s in seeds], dtype=float)


def _resample_means(b: np.ndarray, a: np.ndarray, resamples: int, rng_seed: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.random.default_rng(rng_seed).integers(0, len(b), size=(resamples, len(b)))  # [R, n] seed draws
    return b[idx].mean(axis=1), a[idx].mean(axis=1)  # [R], [R]: one paired draw per row


def _bounds(samples: np.ndarray, level: float) -> tuple[float, float]:
    if not 0 < level < 1:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    tail = (1 - level) / 2
    low, high = np.quantile(samples, [tail, 1 - tail])
    return float(low), float(high)


def paired_ratio(
    baseline: Mapping[int, float | None],
    arm: Mapping[int, float | None],
    *,
    resamples: int = 10_000,
    level: float = 0.95,
    rng_seed: int = 0,
) -> PairedInterval | None:
    """mean(arm) / mean(baseline) over the paired seeds, with its interval (the per-seed range below 5 pairs).

    None when no seed pairs up or the baseline's mean is not positive (a ratio to zero says nothing).
    """
    seeds, b, a = pair_by_seed(baseline, arm)
    if not seeds or b.mean() <= 0:
        return None
    mean_b, mean_a = _resample_means(b, a, resamples, rng_seed)
    ratios = mean_a[mean_b > 0] / mean_b[mean_b > 0]  # [R'] draws with a zero baseline mean say nothing
    return _interval(float(a.mean() / b.mean()), a[b > 0] / b[b > 0], ratios, seeds, level)


def paired_difference(
    baseline: Mapping[int, float | None],
    arm: Mapping[int, float | None],
    *,
    resamples: int = 10_000,
    level: float = 0.95,
    rng_seed: int = 0,
) -> PairedInterval | None:
    """mean(arm - baseline) over the paired seeds, with its interval (per-seed range below 5 pairs; None: no pairs)."""
    seeds, b, a = pair_by_seed(baseline, arm)
    if not seeds:
        return None
    mean_b, mean_a = _resample_means(b, a, resamples, rng_seed)
    return _interval(float((a - b).mean()), a - b, mean_a - mean_b, seeds, level)


def mean_sd(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof 1) of the finite values; None where undefined."""
    finite = [v for v in values if _finite(v)]
    if not finite:
        return None, None
    mean = sum(finite) / len(finite)
    if len(finite) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
