import math

import pytest

from pipeline.student_t import t_interval, t_quantile


def test_t_quantile_matches_the_tables():
    # Student's t, 97.5 % point: df 1 12.706, 2 4.303, 4 2.776, 9 2.262, 30 2.042
    for df, value in ((1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423)):
        assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-4)
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764, abs=1e-4)
    with pytest.raises(ValueError, match="quantile"):
        t_quantile(1.0, 3)


def test_t_interval_of_a_mean():
    assert t_interval([2.0]) == (2.0, None, None)
    mean, low, high = t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert mean == 3.0 and high - mean == pytest.approx(2.7764 * math.sqrt(2.5) / math.sqrt(5), rel=1e-4)
    assert mean - low == pytest.approx(high - mean)
    with pytest.raises(ValueError, match="no values"):
        t_interval([])
    with pytest.raises(ValueError, match="level"):
        t_interval([1.0, 2.0], level=1.0)
