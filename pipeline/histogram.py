"""A fixed-size log-bucket histogram: quantiles of a stream in constant memory.

Long runs must not keep every sample (the loop-lag monitor alone records 100 a second). Values fall into
`per_decade` log-spaced buckets between `lo` and `hi` (plus an underflow and an overflow bucket); a
quantile is the upper edge of the bucket that holds it, so its relative error is at most
10 ** (1 / per_decade) - 1 (12% at the default 20 buckets per decade).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class LogHistogram:
    def __init__(self, lo: float = 1e-6, hi: float = 1e3, per_decade: int = 20) -> None:
        if not 0 < lo < hi or per_decade < 1:
            raise ValueError("LogHistogram needs 0 < lo < hi and per_decade >= 1")
        self.lo, self.hi, self.per_decade = lo, hi, per_decade
        self._buckets = math.ceil(math.log10(hi / lo) * per_decade)
        self.counts = [0] * (self._buckets + 2)  # [underflow, buckets..., overflow]
        self.total = 0
        self.max = 0.0

    def _index(self, value: float) -> int:
        if value < self.lo:
            return 0
        if value >= self.hi:
            return self._buckets + 1
        return 1 + min(self._buckets - 1, int(math.log10(value / self.lo) * self.per_decade))

    def _upper_edge(self, index: int) -> float:
        if index == 0:
            return self.lo
        if index > self._buckets:
            return self.max
        return min(self.lo * 10 ** (index / self.per_decade), self.max)

    def add(self, value: float) -> None:
        self.counts[self._index(value)] += 1
        self.total += 1
        self.max = max(self.max, value)

    def quantile(self, q: float) -> float:
        """The q-quantile (0 < q <= 1) as the upper edge of its bucket; NaN when empty."""
        if not self.total:
            return float("nan")
        rank = max(1, math.ceil(q * self.total))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return self._upper_edge(index)
        return self.max

    def state_dict(self) -> dict[str, Any]:
        return {"lo": self.lo, "hi": self.hi, "per_decade": self.per_decade, "counts": list(self.counts), "max": self.max}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if (state["lo"], state["hi"], state["per_decade"]) != (self.lo, self.hi, self.per_decade):
            raise ValueError("histogram state has other buckets")
        self.counts = [int(c) for c in state["counts"]]
        self.total = sum(self.counts)
        self.max = float(state["max"])
