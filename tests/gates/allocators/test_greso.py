"""GRESO: the §7 anchors for skipping, run counters, the controller and ABS; then streaming."""

from __future__ import annotations

import pytest

from gates.allocators.greso import (
    abs_next_batch,
    greso_controller,
    greso_skip,
    greso_skip_probability,
    update_runs,
)

from .sim import Sim, build, make_result, make_tasks, mixed_probs


def test_skip_probability_anchors() -> None:
    assert greso_skip_probability(0.5, 0) == 0.0
    assert greso_skip_probability(0.05, 0) == 0.0
    assert greso_skip_probability(0.5, 1) == pytest.approx(0.5)
    assert greso_skip_probability(0.5, 3) == pytest.approx(0.875)
    for z in (2, 3, 10):
        assert greso_skip_probability(0.05, z) == pytest.approx(0.99)  # keep floor 0.01


def test_never_skipped_without_a_zero_variance_run() -> None:
    def draw() -> float:
        raise AssertionError("no random draw is needed")

    assert not greso_skip(0, 0, 0.05, 0.05, draw)


def test_easy_run_decides_alone_and_hard_test_is_not_reached() -> None:
    draws = iter([0.6])
    # z_easy = 3 at p_easy 0.5 → skip prob 0.875 > 0.6; one draw only, p_hard irrelevant
    assert greso_skip(3, 0, 0.5, 0.99, lambda: next(draws))
    draws = iter([0.9])
    assert not greso_skip(3, 0, 0.5, 0.05, lambda: next(draws))


def test_hard_run_uses_p_hard() -> None:
    assert greso_skip(0, 2, 0.99, 0.5, lambda: 0.7)  # 1 − 0.25 = 0.75 > 0.7
    assert not greso_skip(0, 2, 0.99, 0.5, lambda: 0.8)


def test_runs_extend_and_mixed_resets_both() -> None:
    assert update_runs(2, 0, [True] * 4) == (3, 0)
    assert update_runs(2, 0, [False] * 4) == (0, 1)
    assert update_runs(0, 5, [False] * 4) == (0, 6)
    assert update_runs(3, 0, [True, False]) == (0, 0)
    assert update_runs(0, 3, [False, True]) == (0, 0)


def test_controller() -> None:
    assert greso_controller(0.5, rate=0.3, target=0.25, epoch=1) == pytest.approx(0.49)
    assert greso_controller(0.5, rate=0.25, target=0.25, epoch=1) == pytest.approx(0.49)  # >= skips more
    assert greso_controller(0.5, rate=0.1, target=0.25, epoch=1) == pytest.approx(0.51)
    assert greso_controller(0.05, rate=0.9, target=0.25, epoch=3) == 0.05
    assert greso_controller(0.95, rate=0.0, target=0.25, epoch=3) == 0.95
    assert greso_controller(0.5, rate=0.9, target=0.25, epoch=0) == 0.5  # no update in epoch 0


def test_adaptive_batch_size() -> None:
    assert abs_next_batch(100, 0.5, b0=384) == (250, True)
    assert abs_next_batch(300, 0.5, b0=384) == (384, False)  # est 750 > b0
    assert abs_next_batch(10, 0.0, b0=384) == (64, True)  # est 12 → floor 64
    assert abs_next_batch(10, 1.0, b0=384)[0] == 384  # zv = 1 does not divide by zero


def _drive(allocator, successes: list[bool], gid: int) -> list:
    admission = allocator.next_admission(64)
    allocator.on_admitted(gid, admission)
    return allocator.on_result(make_result(gid, admission.task_id, successes))


def test_always_solved_prompts_get_skipped_and_rates_adapt() -> None:
    tasks = make_tasks(40)
    probs = mixed_probs(tasks)
    allocator = build("greso", tasks, batch_groups=4)
    sim = Sim(allocator, probs, batch_groups=4, seed=3, cut_prob=0.05).run(600).drain()
    stats = allocator.statistics()
    assert stats["allocator/prompts_skipped"] > 100
    assert all(len(g.trajectories) == 8 for g in sim.emitted)
    assert all(len({t.reward for t in g.trajectories}) == 2 for g in sim.emitted)
    later = [a.task_id for _, a in sim.admissions[len(sim.admissions) // 2 :]]
    # a quarter of the tasks are always solved and a quarter never: skipping thins both out
    assert sum(probs[t] == 1.0 for t in later) / len(later) < 0.15
    assert sum(probs[t] == 0.0 for t in later) / len(later) < 0.15
    assert stats["allocator/epoch"] >= 2
    # below the zero-variance targets the controller explores more (raises p), within its clip range
    assert 0.5 < stats["allocator/p_easy"] <= 0.95
    assert 0.5 < stats["allocator/p_hard"] <= 0.95


def test_in_flight_target_follows_abs() -> None:
    tasks = make_tasks(8)
    allocator = build("greso", tasks, batch_groups=8, lookahead_batches=0.0)
    assert allocator.in_flight_target() == 10  # int(8 / (1 − 0) · 1.25), within [2, 12]
    started = 0
    while (admission := allocator.next_admission(1000)) is not None:
        allocator.on_admitted(started, admission)
        started += 1
    assert started == 10


def test_controller_runs_once_per_update_from_the_second_pass() -> None:
    allocator = build("greso", make_tasks(2), batch_groups=1)
    for gid in range(2):  # pass 0
        _drive(allocator, [True] * 8, gid)
    allocator.on_update(1)
    assert (allocator.p_easy, allocator.p_hard) == (0.5, 0.5)  # no update in epoch 0
    for gid in range(2, 5):  # pass >= 1: every group all-correct
        _drive(allocator, [True] * 8, gid)
    allocator.on_update(2)
    assert allocator.p_easy == pytest.approx(0.49)  # easy rate 1 >= 1/12: skip more
    assert allocator.p_hard == pytest.approx(0.51)  # hard rate 0 < 1/6: explore more
    allocator.on_update(3)  # nothing observed since: no change
    assert allocator.p_easy == pytest.approx(0.49)
