"""The predictor's math as pure functions: inference, threshold choice, intervals, the folded fit."""

import math
import random

import pytest

from gates.zero_variance_model import (
    FitSettings,
    LinearModel,
    fit_checkpoint,
    precision_bound,
    precision_threshold,
    probability,
    wilson_interval,
)


def test_probability_is_the_logistic_of_the_linear_score():
    model = LinearModel(coef=[2.0, -1.0], intercept=0.5)
    z = 0.5 + 2.0 * 0.3 - 1.0 * 1.2
    assert probability(model, [0.3, 1.2]) == pytest.approx(1 / (1 + math.exp(-z)))
    assert probability(LinearModel(coef=[1.0], intercept=0.0), [-800.0]) == 0.0  # no overflow either way
    assert probability(LinearModel(coef=[1.0], intercept=0.0), [800.0]) == 1.0
    with pytest.raises(ValueError, match="shorter"):
        probability(model, [1.0])


def test_precision_threshold_takes_the_most_recall_at_the_target():
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    labels = [True, True, True, False, True, False]
    # >= 0.7: 3/3; >= 0.5: 4/5 = 0.8; >= 0.4: 4/6
    assert precision_threshold(scores, labels, 1.0, 1) == 0.7
    assert precision_threshold(scores, labels, 0.8, 1) == 0.5
    assert precision_threshold(scores, labels, 0.8, 6) is None  # too few flagged at any qualifying threshold
    assert precision_threshold(scores, labels, 0.95, 4) is None


def test_precision_threshold_never_splits_a_tie():
    # flagging the tied 0.8 pair together gives 2/3; there is no threshold flagging only one of them
    assert precision_threshold([0.9, 0.8, 0.8], [True, True, False], 0.9, 1) == 0.9
    assert precision_threshold([], [], 0.9, 1) is None


def test_wilson_interval():
    assert wilson_interval(0, 0) is None
    lo, hi = wilson_interval(19, 20)
    assert lo == pytest.approx(0.7639, abs=1e-3) and hi == pytest.approx(0.9911, abs=1e-3)
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=1e-3)


def test_the_fitted_model_is_sklearns_with_the_scaler_folded_in():
    rng = random.Random(1)
    xs = [[rng.gauss(0, 1) * 5 + 10, rng.gauss(0, 1), 3.0] for _ in range(300)]  # a constant column too
    ys = [x[0] - 10 + 4 * x[1] + rng.gauss(0, 2) > 0 for x in xs]
    model = fit_checkpoint(xs, ys, FitSettings(0.9, 5, cut_allowed=True))
    assert model is not None and model.labels == 300
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    reference = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(xs, ys)
    expected = reference.predict_proba(xs[:20])[:, 1]
    assert [probability(model, x) for x in xs[:20]] == pytest.approx(expected.tolist(), abs=1e-9)
    assert model.threshold is not None and 0.0 < model.threshold < 1.0
    flagged = [y for x, y in zip(xs, ys, strict=True) if probability(model, x) >= model.threshold]
    assert sum(flagged) / len(flagged) >= 0.85  # in sample, near the out-of-fold target


def test_no_fit_without_both_classes_and_no_threshold_in_the_warm_up():
    assert fit_checkpoint([[0.0]] * 10, [True] * 10, FitSettings(0.9, 1, cut_allowed=True)) is None
    xs = [[float(i)] for i in range(20)]
    model = fit_checkpoint(xs, [i >= 10 for i in range(20)], FitSettings(0.9, 1, cut_allowed=False))
    assert model is not None and model.threshold is None


def test_at_a_confidence_the_threshold_needs_the_precision_s_lower_bound():
    """Ten flagged groups all positive have a point precision of 1.0 but a 90 % one-sided Wilson lower bound of
    0.86: at confidence 0.9 a 0.95 target needs more flagged (32 all positive), at 0 the point estimate passes."""
    scores = [1.0 - i / 100 for i in range(40)]
    ten = [i < 10 for i in range(40)]
    assert precision_threshold(scores, ten, 0.95, 1, confidence=0.0) == scores[9]
    assert precision_threshold(scores, ten, 0.95, 1, confidence=0.9) is None
    assert precision_threshold(scores, ten, 0.85, 1, confidence=0.9) == scores[9]
    many = [i < 35 for i in range(40)]
    assert precision_threshold(scores, many, 0.95, 1, confidence=0.9) == scores[34]
    assert precision_bound(10, 10, 0.0) == 1.0 and precision_bound(10, 10, 1.2816) == pytest.approx(0.8590, abs=1e-3)
