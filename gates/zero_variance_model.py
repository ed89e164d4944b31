"""The zero-variance predictor's model and its precision control, as pure functions.

* `LinearModel` / `probability`: p = sigmoid(b + w . x), the per-decision inference: a dot product in
  plain Python over the fitted coefficients (the scaler folded in), cheap enough for the event loop.
* `fit_checkpoint`: a logistic regression (scikit-learn's `LogisticRegression` on standardised features:
  a maintained solver with a log-loss fit, hence probabilities that are calibrated in the large) and
  out-of-fold probabilities (`cross_val_predict`) for choosing the threshold. It runs in a worker thread
  (`ZeroVarianceGate.serve`), never on the event loop.
* `precision_threshold`: the lowest threshold whose precision on labelled scores is at least the target
  (the largest recall there), given enough flagged groups, at a declared confidence (the one-sided Wilson
  lower bound of the precision, not its point estimate); `wilson_interval` for the live figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import msgspec


class LinearModel(msgspec.Struct, frozen=True, kw_only=True):
    """p(zero variance | x) = sigmoid(intercept + coef . x), in the raw feature units."""

    coef: list[float]
    intercept: float
    threshold: float | None = None
    """Cut iff p >= threshold; None: no threshold meets the target precision (never cut)."""
    labels: int = 0
    """Labelled groups it was fitted on."""


def probability(model: LinearModel, x: Sequence[float]) -> float:
    """sigmoid(b + w . x), the per-decision inference (pure Python: no array is allocated)."""
    z = model.intercept
    for w, v in zip(model.coef, x, strict=True):
        z += w * v
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def precision_threshold(scores: Sequence[float], labels: Sequence[bool], min_precision: float, min_flagged: int,
                        confidence: float = 0.0) -> float | None:
    """The lowest score t such that the groups with score >= t are at least `min_flagged` and their precision is
    at least `min_precision`: its point estimate when `confidence` is 0, else the one-sided Wilson lower bound
    at that confidence (0.9: the precision is >= `min_precision` with 90 % confidence). The lowest qualifying t
    of many is the winner of a search, so a point estimate there is optimistic; the bound pays for it.
    None when no t qualifies. Ties are flagged together."""
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores for {len(labels)} labels")
    z = NormalDist().inv_cdf(confidence) if confidence > 0 else 0.0
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    best = None
    flagged = positives = 0
    for rank, i in enumerate(order):
        flagged += 1
        positives += labels[i]
        if rank + 1 < len(order) and scores[order[rank + 1]] == scores[i]:
            continue  # a threshold cannot split a tie
        if flagged >= min_flagged and precision_bound(positives, flagged, z) >= min_precision:
            best = scores[i]
    return best


def precision_bound(positives: int, flagged: int, z: float) -> float:
    """The one-sided Wilson lower bound of positives / flagged at z standard errors (z = 0: the point estimate)."""
    p = positives / flagged
    if z == 0:
        return p
    return wilson_interval(positives, flagged, z)[0]  # type: ignore[index]  # flagged > 0


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion (95 % at z = 1.96); None for n = 0."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True, slots=True)
class FitSettings:
    min_precision: float
    min_flagged: int
    cut_allowed: bool
    """Enough labels for a threshold (the warm-up is over): else the model is fitted without one."""
    confidence: float = 0.0
    """`precision_threshold`'s: 0 = the point estimate, else the one-sided confidence of its lower bound."""
    c: float = 1.0
    """Inverse L2 strength of the logistic regression."""


def fit_checkpoint(xs: Sequence[Sequence[float]], ys: Sequence[bool], settings: FitSettings) -> LinearModel | None:
    """A model for one checkpoint from unbiased labelled groups; None with fewer than 4 of either class.

    Runs scikit-learn (imported here: a worker thread pays its import, not the event loop). The threshold
    is chosen on out-of-fold probabilities, so it is not tuned on the very predictions it is judged by.
    """
    positives = sum(ys)
    if positives < 4 or len(ys) - positives < 4:
        return None
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = np.asarray(xs, dtype=np.float64)  # [N, D]
    y = np.asarray(ys, dtype=bool)  # [N]
    pipeline = make_pipeline(StandardScaler(), LogisticRegression(C=settings.c, max_iter=500))
    pipeline.fit(X, y)
    scaler, logistic = pipeline[0], pipeline[1]
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)  # [D]
    coef = logistic.coef_[0] / scale  # [D] folded back into raw units
    intercept = float(logistic.intercept_[0] - (coef * scaler.mean_).sum())
    threshold = None
    if settings.cut_allowed:
        folds = min(5, positives, len(ys) - positives)
        oof = cross_val_predict(pipeline, X, y, cv=StratifiedKFold(folds, shuffle=True, random_state=0),
                                method="predict_proba")[:, 1]  # [N]
        threshold = precision_threshold(oof.tolist(), y.tolist(), settings.min_precision, settings.min_flagged,
                                        settings.confidence)
    return LinearModel(coef=coef.tolist(), intercept=intercept, threshold=threshold, labels=len(ys))
