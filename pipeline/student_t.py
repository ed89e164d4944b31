"""Student's t: its quantiles and the t interval of a mean, for the few paired values a study or a held-out
measure has (seeds of an A/B study, tasks measured before and after a run). Pure functions, numpy only, no scipy:
the CDF is the regularised incomplete beta by continued fraction, the quantile a bisection on it."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np


def _t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom (regularised incomplete beta by continued fraction)."""
    if x == 0:
        return 0.5
    z = df / (df + x * x)
    tail = 0.5 * _betainc(df / 2, 0.5, z)
    return 1 - tail if x > 0 else tail


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (Numerical Recipes' continued fraction, Lentz's method)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):
        return 1 - _betainc(b, a, 1 - x)
    tiny, c, d = 1e-300, 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1) < 1e-14:
            break
    return front * f / a


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` >= 1 degrees of freedom (bisection on the CDF, to 1e-10)."""
    if not 0 < p < 1 or df < 1:
        raise ValueError(f"t quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2
    while high - low > 1e-10 * max(1.0, high):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None, float | None]:
    """Mean of `values` and its Student-t interval (None bounds with one value)."""
    if not 0 < level < 1:
        raise ValueError(f"confidence level must be in (0, 1), got {level}")
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("t_interval of no values")
    mean = float(x.mean())
    if x.size < 2:
        return mean, None, None
    half = t_quantile(1 - (1 - level) / 2, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half
