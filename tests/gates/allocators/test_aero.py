"""AERO (reconstruction): rescue, rejection counts, Beta posterior anchors; then streaming."""

from __future__ import annotations

import random

import pytest

from gates.allocators.aero import (
    DEAD_ZONE,
    KEEP_ALL,
    REJECTION,
    aero_curate,
    beta_posterior_mean,
    first_success_prefix,
    rescue_size,
)

from .sim import Sim, build, make_result, make_tasks, mixed_probs


def test_rescue_stops_at_first_success_or_the_budget() -> None:
    assert rescue_size(8, 0, n_total=16, n_extra=2) == 2
    assert rescue_size(15, 0, n_total=16, n_extra=2) == 1
    assert rescue_size(16, 0, n_total=16, n_extra=2) == 0
    assert rescue_size(10, 1, n_total=16, n_extra=2) == 0
    assert first_success_prefix([False, True, True]) == 2  # the rest of the chunk is discarded
    assert first_success_prefix([False, False]) == 2


@pytest.mark.parametrize(("c", "n"), [(1, 8), (2, 8), (3, 8), (1, 10), (3, 16)])
@pytest.mark.parametrize("k", [1.0, 2.0])
def test_rejection_keeps_all_correct_and_k_times_as_many_wrong(c: int, n: int, k: float) -> None:
    successes = [True] * c + [False] * (n - c)
    random.Random(c).shuffle(successes)
    kept, stratum = aero_curate(successes, random.Random(0), k=k)
    assert stratum == REJECTION
    assert sum(successes[i] for i in kept) == c
    assert sum(not successes[i] for i in kept) == min(int(k * c), n - c)
    assert kept == sorted(set(kept))


def test_curation_strata() -> None:
    rng = random.Random(0)
    assert aero_curate([True] * 8, rng) == ([], DEAD_ZONE)
    assert aero_curate([False] * 16, rng) == ([], DEAD_ZONE)
    assert aero_curate([True] * 4 + [False] * 4, rng) == (list(range(8)), KEEP_ALL)  # u = 0.5 keeps all


def test_beta_posterior_anchors() -> None:
    assert beta_posterior_mean(8, 8) == pytest.approx(0.9)
    assert beta_posterior_mean(0, 16) == pytest.approx(1 / 18)
    assert beta_posterior_mean(3, 8, alpha0=2.0, beta0=2.0) == pytest.approx(5 / 12)


def _start(allocator, gid: int, free: int = 64):
    admission = allocator.next_admission(free)
    allocator.on_admitted(gid, admission)
    return admission


def test_all_fail_prompt_is_rescued_until_its_first_success() -> None:
    allocator = build("aero", make_tasks(4))  # n_explore 8, n_total 16, n_extra 2
    explore = _start(allocator, 0)
    assert allocator.on_result(make_result(0, explore.task_id, [False] * 8)) == []
    rescue = _start(allocator, 1)
    assert (rescue.task_id, rescue.size, rescue.kind, rescue.parent) == (explore.task_id, 2, "rescue", 0)
    assert allocator.on_result(make_result(1, explore.task_id, [False, False])) == []
    rescue = _start(allocator, 2)
    [group] = allocator.on_result(make_result(2, explore.task_id, [True, True]))  # stop at the first success
    assert group.group_id == 0
    # 11 rollouts (10 wrong + the first success); u < 0.5: the success and k·1 = 1 wrong train
    assert [t.success for t in group.trajectories].count(True) == 1
    assert len(group.trajectories) == 2
    stats = allocator.statistics()
    assert stats["allocator/rollouts_spent"] == 12
    assert stats["allocator/rollouts_discarded"] == 10  # 1 after the first success, 9 rejected
    assert stats["allocator/groups_rescue_successes"] == 1


def test_hopeless_prompt_stops_at_the_budget_as_a_dead_zone() -> None:
    allocator = build("aero", make_tasks(4))
    explore = _start(allocator, 0)
    allocator.on_result(make_result(0, explore.task_id, [False] * 8))
    for gid in range(1, 5):
        rescue = _start(allocator, gid)
        assert rescue.kind == "rescue"
        assert allocator.on_result(make_result(gid, explore.task_id, [False] * rescue.size)) == []
    assert _start(allocator, 5).kind == "explore"  # 16 spent: no more rescue
    stats = allocator.statistics()
    assert stats["allocator/groups_dead_zone"] == 1
    assert stats["allocator/dead_zone_baseline"] == pytest.approx(1 / 18)


def test_streaming() -> None:
    tasks = make_tasks(40)
    probs = mixed_probs(tasks) | {t.task_id: 0.08 for t in tasks[::8]}  # some need rescuing
    allocator = build("aero", tasks)
    sim = Sim(allocator, probs, cut_prob=0.1, seed=8).run(500).drain()
    stats = allocator.statistics()
    per_prompt: dict[int, int] = {}
    for gid, a in sim.admissions:
        root = gid if a.parent is None else a.parent
        per_prompt[root] = per_prompt.get(root, 0) + a.size
    assert max(per_prompt.values()) <= 16
    assert {a.kind for _, a in sim.admissions} == {"explore", "rescue"}
    assert all(2 <= len(g.trajectories) <= 16 for g in sim.emitted)
    for g in sim.emitted:
        c = sum(t.success for t in g.trajectories)
        assert 0 < c < len(g.trajectories)  # dead zones never train
        if c / len(g.trajectories) < 0.5:
            assert len(g.trajectories) == 2 * c  # rejection balanced it (k = 1)
    assert stats["allocator/groups_rescue_successes"] > 0
    assert stats["allocator/rollouts_trained"] < stats["allocator/rollouts_spent"]
