"""The constant-memory histogram: quantiles within one bucket of the exact value, state round trip."""

import math
import random

import pytest

from pipeline.histogram import LogHistogram


def test_quantile_is_within_one_bucket_of_the_exact_value():
    rng = random.Random(0)
    samples = [rng.lognormvariate(-7, 1.5) for _ in range(20_000)]
    hist = LogHistogram()
    for x in samples:
        hist.add(x)
    exact = sorted(samples)[math.ceil(0.99 * len(samples)) - 1]
    assert exact <= hist.quantile(0.99) <= exact * 10 ** (1 / hist.per_decade)
    assert len(hist.counts) < 200 and hist.total == len(samples)  # memory does not grow with samples


def test_empty_underflow_overflow_and_round_trip():
    hist = LogHistogram(lo=1e-3, hi=1.0)
    assert math.isnan(hist.quantile(0.5))
    for x in (0.0, 0.0, 5.0):
        hist.add(x)
    assert hist.quantile(0.5) == 1e-3  # zeros land in the underflow bucket
    assert hist.quantile(1.0) == 5.0  # overflow reads back as the maximum seen
    again = LogHistogram(lo=1e-3, hi=1.0)
    again.load_state_dict(hist.state_dict())
    assert again.counts == hist.counts and again.quantile(1.0) == 5.0
    with pytest.raises(ValueError, match="other buckets"):
        LogHistogram().load_state_dict(hist.state_dict())
