import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.ab._stats import mean_sd, pair_by_seed, paired_difference, paired_ratio


def test_pairs_only_seeds_both_arms_finished():
    seeds, b, a = pair_by_seed({0: 10.0, 1: 20.0, 3: None}, {0: 5.0, 1: 10.0, 2: 99.0, 3: 1.0})
    assert seeds == (0, 1)
    assert list(b) == [10.0, 20.0] and list(a) == [5.0, 10.0]


def test_a_constant_per_seed_ratio_has_a_zero_width_interval():
    # Seeds differ a lot, the arm is 0.8x its own seed's baseline every time: paired resampling sees
    # only 0.8. Resampling the arms independently would mix seeds and give a wide interval.
    baseline = {0: 100.0, 1: 300.0, 2: 50.0, 3: 220.0}
    arm = {s: 0.8 * v for s, v in baseline.items()}
    result = paired_ratio(baseline, arm, resamples=2000)
    assert result is not None
    assert result.estimate == pytest.approx(0.8)
    assert result.ci_low == pytest.approx(0.8) and result.ci_high == pytest.approx(0.8)
    assert result.n_pairs == 4


def test_two_seed_ratio_interval_matches_the_enumerated_resamples():
    # baseline 1, 1; arm 1, 2: resampled arm means are 1 (p 1/4), 1.5 (1/2), 2 (1/4), so the 95 %
    # percentile interval is exactly [1, 2] and the estimate 1.5.
    result = paired_ratio({0: 1.0, 1: 1.0}, {0: 1.0, 1: 2.0}, resamples=4000)
    assert result is not None
    assert (result.estimate, result.ci_low, result.ci_high) == (1.5, 1.0, 2.0)


def test_difference_interval_on_known_data():
    result = paired_difference({0: 0.4, 1: 0.5}, {0: 0.4, 1: 0.6}, resamples=4000)
    assert result is not None
    assert result.estimate == pytest.approx(0.05)
    assert result.ci_low == pytest.approx(0.0) and result.ci_high == pytest.approx(0.1)


def test_one_seed_gives_the_point_and_no_pairs_gives_none():
    one = paired_ratio({0: 10.0}, {0: 7.0})
    assert one is not None and (one.estimate, one.ci_low, one.ci_high) == (0.7, 0.7, 0.7)
    assert paired_ratio({0: 10.0}, {1: 7.0}) is None
    assert paired_ratio({0: 0.0}, {0: 7.0}) is None  # a ratio to zero says nothing
    assert paired_difference({}, {}) is None


def test_same_rng_seed_same_interval_and_bad_level_is_refused():
    baseline, arm = {0: 10.0, 1: 12.0, 2: 9.0}, {0: 8.0, 1: 11.0, 2: 9.5}
    assert paired_ratio(baseline, arm, rng_seed=3) == paired_ratio(baseline, arm, rng_seed=3)
    with pytest.raises(ValueError, match="level"):
        paired_ratio(baseline, arm, level=1.5)


@given(st.dictionaries(st.integers(0, 9), st.floats(0.1, 1e4), min_size=1, max_size=6),
       st.lists(st.floats(0.1, 10.0), min_size=6, max_size=6))
def test_interval_and_estimate_lie_within_the_per_seed_ratios(baseline, factors):
    arm = {s: v * factors[i] for i, (s, v) in enumerate(sorted(baseline.items()))}
    result = paired_ratio(baseline, arm, resamples=500)
    assert result is not None
    lo, hi = min(factors[: len(baseline)]), max(factors[: len(baseline)])
    # a ratio of means is a weighted mean of per-seed ratios, so every resample lies in [lo, hi]
    assert lo - 1e-9 <= result.ci_low <= result.ci_high <= hi + 1e-9
    assert lo - 1e-9 <= result.estimate <= hi + 1e-9


def test_mean_sd_skips_missing_values():
    assert mean_sd([1.0, None, 3.0, float("nan")]) == (2.0, math.sqrt(2.0))
    assert mean_sd([5.0]) == (5.0, None)
    assert mean_sd([None]) == (None, None)


def test_below_five_seeds_the_bounds_are_the_range_over_seeds_and_say_so():
    baseline, arm = {0: 10.0, 1: 12.0, 2: 9.0}, {0: 8.0, 1: 11.0, 2: 9.5}
    three = paired_difference(baseline, arm)
    assert three is not None and three.kind == "range"
    assert (three.ci_low, three.ci_high) == (-2.0, 0.5)  # min and max of the per-seed differences
    assert three.describe() == "range over 3 seeds" and "95" not in three.describe()
    five = paired_ratio({s: 10.0 + s for s in range(5)}, {s: 9.0 + 2 * s for s in range(5)})
    assert five is not None and five.kind == "bootstrap"
    assert five.describe() == "95 % paired bootstrap interval, n = 5"
    assert five.to_json()["kind"] == "bootstrap"


def test_the_ab_report_marks_a_three_seed_range_as_a_range():
    from pipeline.ab._markdown import _interval

    assert _interval(paired_ratio({0: 10.0, 1: 12.0, 2: 9.0}, {0: 8.0, 1: 11.0, 2: 9.5}).to_json()).endswith("(n=3, range)")
    five = paired_ratio({s: 10.0 + s for s in range(5)}, {s: 9.0 + 2 * s for s in range(5)})
    assert _interval(five.to_json()).endswith("(n=5, CI)")
