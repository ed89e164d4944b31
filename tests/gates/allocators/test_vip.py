"""VIP (reconstruction): greedy allocation anchors against brute force, the GP predictor, streaming rounds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gates.allocators._gp import (
    expected_bernoulli_variance,
    gp_posterior,
    logit_observation,
    rbf_kernel,
    spd_solve,
    task_features,
)
from gates.allocators.vip import greedy_allocation, h_dr_grpo, h_rloo

from .sim import Sim, build, make_result, make_tasks

H = {"rloo": (h_rloo, 2), "dr_grpo": (h_dr_grpo, 3)}


def _objective(v: list[float], n: list[int], h) -> float:
    return sum(vq * h(nq) for vq, nq in zip(v, n, strict=True))


@settings(max_examples=150, deadline=None)
@given(
    v=st.lists(st.floats(0, 0.25), min_size=1, max_size=4),
    width=st.integers(0, 4),
    data=st.data(),
    estimator=st.sampled_from(sorted(H)),
)
def test_greedy_matches_brute_force(v: list[float], width: int, data: st.DataObject, estimator: str) -> None:
    h, lo = H[estimator]
    hi = lo + width
    budget = data.draw(st.integers(lo * len(v), hi * len(v)))
    n = greedy_allocation(v, budget, lo, hi, h)
    assert sum(n) == budget
    assert all(lo <= nq <= hi for nq in n)
    best = min(
        _objective(v, list(c), h)
        for c in itertools.product(range(lo, hi + 1), repeat=len(v))
        if sum(c) == budget
    )
    assert _objective(v, n, h) == pytest.approx(best, abs=1e-12)


@given(v=st.lists(st.floats(0, 0.25), min_size=2, max_size=12), extra=st.integers(0, 60))
def test_greedy_is_monotone_in_variance(v: list[float], extra: int) -> None:
    budget = min(3 * len(v) + extra, 16 * len(v))
    n = greedy_allocation(v, budget, 3, 16, h_rloo)
    for i, j in itertools.permutations(range(len(v)), 2):
        if v[i] > v[j]:
            assert n[i] >= n[j]


def test_zero_variance_prompt_stays_at_the_lower_bound() -> None:
    n = greedy_allocation([0.0, 0.2, 0.1, 0.0], budget=24, lo=2, hi=10, h=h_rloo)
    assert n[0] == n[3] == 2
    assert sum(n) == 24


def test_unreachable_budget_is_an_error() -> None:
    with pytest.raises(ValueError, match="not reachable"):
        greedy_allocation([0.1, 0.2], budget=40, lo=2, hi=16, h=h_rloo)


def test_expected_bernoulli_variance() -> None:
    assert expected_bernoulli_variance(np.array([0.0]), np.array([1e-12]))[0] == pytest.approx(0.25)
    rng = np.random.default_rng(0)
    f = 1.0 + 2.0 * rng.standard_normal(200_000)
    p = 1 / (1 + np.exp(-f))
    expected = expected_bernoulli_variance(np.array([1.0]), np.array([4.0]))[0]
    assert expected == pytest.approx((p * (1 - p)).mean(), abs=2e-3)
    assert expected < 0.25 * (1 / (1 + math.exp(-1))) * 4  # uncertainty lowers it below the plug-in bound


def test_gp_posterior_interpolates_and_reverts_to_the_prior() -> None:
    x = np.array([[0.0], [1.0], [10.0]])
    k = rbf_kernel(x, x, bandwidth=1.0)
    mean, var = gp_posterior(
        k[:1, :1], k[:, :1], np.ones(3), np.array([2.0]), np.array([1e-6]), prior_mean=0.0
    )
    assert mean[0] == pytest.approx(2.0, abs=1e-4)  # at the observation
    assert 0.0 < mean[1] < 2.0  # a neighbour borrows strength
    assert mean[2] == pytest.approx(0.0, abs=1e-6)  # far away: the prior
    assert var[0] < var[1] < var[2] == pytest.approx(1.0)


def test_logit_observation() -> None:
    y, noise = logit_observation(0, 0)
    assert (y, noise) == (0.0, 4.0)
    y, noise = logit_observation(8, 8)  # p̂ = 8.5 / 9 = 17/18
    assert y == pytest.approx(math.log(17))
    assert noise == pytest.approx(1 / (9 * (17 / 18) * (1 / 18)))


def test_task_features_standardise_and_one_hot() -> None:
    x = task_features(make_tasks(6))
    assert x.shape == (6, 2 + 3)
    assert np.allclose(x[:, :2].mean(0), 0.0)
    assert np.allclose(x[:, 2:].sum(1), 1.0)


def test_predicts_from_similar_prompts() -> None:
    tasks = make_tasks(30)
    allocator = build("vip", tasks)
    for gid, t in enumerate(tasks[:12]):  # observe 4 of each family: pick solved, clean failed, heat mixed
        outcome = {"pick": [True] * 8, "clean": [False] * 8, "heat": [True, False] * 4}[t.family]
        allocator.on_admitted(gid, allocator.next_admission(64))
        allocator.on_result(make_result(gid, t.task_id, outcome))
    unseen = {t.family: t.task_id for t in tasks[12:]}
    mean, _ = allocator.predict([unseen["pick"], unseen["heat"], unseen["clean"]])
    assert mean[0] > mean[1] > mean[2]


@pytest.mark.parametrize("estimator", ["rloo", "dr_grpo"])
def test_streaming_rounds_spend_the_budget_within_bounds(estimator: str) -> None:
    tasks = make_tasks(48)
    probs = {t.task_id: {"pick": 0.97, "clean": 0.03, "heat": 0.5}[t.family] for t in tasks}
    allocator = build("vip", tasks, estimator=estimator, window=6)
    sim = Sim(allocator, probs, slots=48, cut_prob=0.1, seed=6).run(600).drain()
    sizes = [a.size for _, a in sim.admissions]
    lo, hi = allocator.lo, allocator.hi
    assert all(lo <= s <= hi for s in sizes)
    # every round of 6 prompts spends exactly budget_per_prompt · window = 48 rollouts
    rounds = len(sizes) // 6
    assert all(sum(sizes[6 * r : 6 * r + 6]) == 48 for r in range(rounds))
    assert len(sim.emitted) > 0
    late = sim.admissions[len(sim.admissions) // 2 :]
    by_family = {
        f: [a.size for _, a in late if probs[a.task_id] == p] for f, p in [("easy", 0.97), ("mixed", 0.5)]
    }
    assert np.mean(by_family["mixed"]) > np.mean(by_family["easy"]) + 1  # budget moves to uncertain prompts


def test_groups_larger_than_every_slot_are_shrunk_not_stalled() -> None:
    tasks = make_tasks(12)
    probs = dict.fromkeys((t.task_id for t in tasks), 0.5)
    allocator = build("vip", tasks, max_rollouts=16, budget_per_prompt=12)
    sim = Sim(allocator, probs, slots=10, seed=7).run(100)
    assert max(a.size for _, a in sim.admissions) == 10


def test_spd_solve_matches_numpy() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 3))
    a = rbf_kernel(x, x, bandwidth=1.5) + 0.1 * np.eye(40)
    b = rng.standard_normal((40, 5))
    assert np.allclose(spd_solve(a, b), np.linalg.solve(a, b), atol=1e-10)
