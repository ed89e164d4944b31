"""Paired percentile bootstrap over seeds: an arm's mean against the baseline arm's, seed by seed.

Seeds are the unit of replication: seed s of every arm shares the task order, the warm start and the
machine's drift (the harness interleaves arms by seed), so a resample draws *seeds* with replacement and
takes both arms' values of each drawn seed together. Values missing in either arm drop that seed.

With n seeds there are at most C(2n-1, n) distinct resamples (10 for n = 3): the interval is coarse, and
with one seed it is the point itself. The report states n next to every interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PairedInterval:
    estimate: float
    """Statistic of the paired seeds' values (ratio of means, or mean difference)."""
    ci_low: float
    ci_high: float
    seeds: tuple[int, ...]
    """The seeds both arms have a value for (the pairs resampled)."""

    @property
    def n_pairs(self) -> int:
        return len(self.seeds)

    def to_json(self) -> dict[str, object]:
        return {"estimate": self.estimate, "ci_low": self.ci_low, "ci_high": self.ci_high, "n_pairs": self.n_pairs, "seeds": list(self.seeds)}


def _finite(value: float | None) -> bool:
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
    """mean(arm) / mean(baseline) over the paired seeds, with its percentile bootstrap interval.

    None when no seed pairs up or the baseline's mean is not positive (a ratio to zero says nothing).
    """
    seeds, b, a = pair_by_seed(baseline, arm)
    if not seeds or b.mean() <= 0:
        return None
    mean_b, mean_a = _resample_means(b, a, resamples, rng_seed)
    ratios = mean_a[mean_b > 0] / mean_b[mean_b > 0]  # [R'] draws with a zero baseline mean say nothing
    low, high = _bounds(ratios, level)
    return PairedInterval(float(a.mean() / b.mean()), low, high, seeds)


def paired_difference(
    baseline: Mapping[int, float | None],
    arm: Mapping[int, float | None],
    *,
    resamples: int = 10_000,
    level: float = 0.95,
    rng_seed: int = 0,
) -> PairedInterval | None:
    """mean(arm - baseline) over the paired seeds, with its percentile bootstrap interval (None: no pairs)."""
    seeds, b, a = pair_by_seed(baseline, arm)
    if not seeds:
        return None
    mean_b, mean_a = _resample_means(b, a, resamples, rng_seed)
    low, high = _bounds(mean_a - mean_b, level)
    return PairedInterval(float((a - b).mean()), low, high, seeds)


def mean_sd(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (ddof 1) of the finite values; None where undefined."""
    finite = [v for v in values if _finite(v)]
    if not finite:
        return None, None
    mean = sum(finite) / len(finite)
    if len(finite) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1))
