"""A small exact Gaussian-process regressor on logit success rates, for VIP (allocators.md §5, option ii).

Reconstruction (§5 says VIP's code is unreleased): prompts are points in a feature space built from
`Task.features` (each numeric feature standardised) plus a one-hot of `Task.family`, in place of the paper's
MiniLM embeddings; the kernel is RBF with a median-heuristic bandwidth; a prompt's recent outcomes (k
successes in n trials) become one Gaussian observation `y = logit((k + ½)/(n + 1))` with noise variance
`1 / ((n + 1) p̂ (1 − p̂))`; the posterior of the latent logit of any prompt is then exact GP regression.
numpy only; one O(m³) solve over the m <= `max_observed` (128) most recent prompts per allocation round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pipeline.contracts import Task


def task_features(tasks: Sequence[Task]) -> np.ndarray:
    """[T, D] design matrix: standardised numeric features (missing = column mean), then a family one-hot."""
    keys = sorted({k for t in tasks for k in t.features})
    families = sorted({t.family for t in tasks})
    numeric = np.array([[float(t.features.get(k, np.nan)) for k in keys] for t in tasks], dtype=float)
    numeric = numeric.reshape(len(tasks), len(keys))
    if keys:
        mean = np.nanmean(numeric, axis=0)
        numeric = np.where(np.isnan(numeric), mean, numeric)
        std = numeric.std(axis=0)
        numeric = (numeric - mean) / np.where(std > 0, std, 1.0)
    one_hot = np.array([[float(t.family == f) for f in families] for t in tasks]).reshape(len(tasks), -1)
    return np.hstack([numeric, one_hot])  # [T, D]


def median_bandwidth(x: np.ndarray, max_points: int = 400) -> float:
    """Median heuristic: the median non-zero pairwise distance between (at most `max_points`) rows; 1.0 if none."""
    x = x[:max_points]
    d = np.sqrt(np.maximum(_sq_dists(x, x), 0.0))  # [P, P]
    positive = d[np.triu_indices(len(x), k=1)]
    positive = positive[positive > 1e-12]
    return float(np.median(positive)) if positive.size else 1.0


def rbf_kernel(a: np.ndarray, b: np.ndarray, bandwidth: float, signal_var: float = 1.0) -> np.ndarray:
    """`signal_var · exp(−‖a − b‖² / (2 ℓ²))` for every row pair: [A, D] x [B, D] -> [A, B]."""
    return signal_var * np.exp(-np.maximum(_sq_dists(a, b), 0.0) / (2.0 * bandwidth**2))


def _sq_dists(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T


def logit_observation(k: float, n: float) -> tuple[float, float]:
    """(y, noise variance) for k successes in n trials: `y = logit(p̂)`, `p̂ = (k + ½)/(n + 1)`,
    noise `1 / ((n + 1) p̂ (1 − p̂))` (the delta-method variance of the empirical logit)."""
    p = (k + 0.5) / (n + 1.0)
    return math.log(p / (1.0 - p)), 1.0 / ((n + 1.0) * p * (1.0 - p))


def gp_posterior(
    k_oo: np.ndarray,
    k_so: np.ndarray,
    k_ss: np.ndarray,
    y: np.ndarray,
    noise: np.ndarray,
    prior_mean: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact GP regression posterior of the latent values at S query points given O noisy observations.

    Args:
        k_oo: [O, O] prior covariance of the observed points. k_so: [S, O] query/observed covariance.
        k_ss: [S] prior variances of the query points. y: [O] observations. noise: [O] noise variances.
        prior_mean: constant prior mean.

    Returns:
        (mean [S], variance [S]).
    """
    if y.size == 0:
        return np.full(k_ss.shape, prior_mean), k_ss.copy()
    rhs = np.column_stack([y - prior_mean, k_so.T])  # [O, 1 + S]
    sol = spd_solve(k_oo + np.diag(noise), rhs)  # [O, 1 + S]
    mean = prior_mean + k_so @ sol[:, 0]  # [S]
    var = np.maximum(k_ss - (k_so.T * sol[:, 1:]).sum(0), 1e-12)  # [S]
    return mean, var


def spd_solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solve `a x = b` for symmetric positive definite `a` [M, M] and `b` [M, K] by Cholesky, row by row.

    Why not `np.linalg.solve`: LAPACK's factorisations run on OpenBLAS's thread pool, which stalls badly
    (tens of ms at M = 128, measured) when the policy and learner threads hold the cores; this loop only
    issues small matrix-vector products, which stay single-threaded: about 3 ms at M = 128, always.
    """
    m = len(a)
    chol = np.zeros_like(a)  # [M, M], lower
    for j in range(m):
        row = chol[j, :j]
        chol[j, j] = math.sqrt(a[j, j] - row @ row)
        chol[j + 1 :, j] = (a[j + 1 :, j] - chol[j + 1 :, :j] @ row) / chol[j, j]
    z = np.zeros_like(b, dtype=float)  # [M, K]: chol z = b
    for i in range(m):
        z[i] = (b[i] - chol[i, :i] @ z[:i]) / chol[i, i]
    x = np.zeros_like(z)  # chol^T x = z
    for i in reversed(range(m)):
        x[i] = (z[i] - chol[i + 1 :, i] @ x[i + 1 :]) / chol[i, i]
    return x


_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(32)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()


def expected_bernoulli_variance(mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """`E[σ(f)(1 − σ(f))]` for f ~ N(mean, var), elementwise, by 32-point Gauss–Hermite quadrature."""
    f = np.asarray(mean)[..., None] + np.sqrt(np.asarray(var))[..., None] * _NODES  # [..., 32]
    p = 1.0 / (1.0 + np.exp(-f))
    return (p * (1.0 - p)) @ _WEIGHTS
