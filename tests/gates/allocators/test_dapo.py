"""DAPO dynamic sampling: the §7 anchors on the synchronous reference, then the streaming allocator."""

from __future__ import annotations

import pytest

from gates.allocators.dapo import TooManyGenerationRounds, dapo_keep, dapo_sync_batch

from .sim import Sim, build, make_result, make_tasks, mixed_probs


@pytest.mark.parametrize(
    ("rewards", "keep"),
    [
        ([1.0, 0.0], True),
        ([0.1, 0.1, 1.0], True),
        ([1.0, 1.0, 1.0], False),
        ([0.0] * 8, False),
        ([0.3], True),
        ([0.0], True),
        ([], False),
    ],
)
def test_keep_iff_std_positive_or_single_rollout(rewards: list[float], keep: bool) -> None:
    assert dapo_keep(rewards) is keep


def test_sync_batch_truncates_to_b_groups_and_discards_surplus() -> None:
    n = 4
    mixed, flat = [1.0, 0.0, 0.0, 1.0], [1.0] * n
    rounds = [[mixed, flat, mixed], [flat, mixed, mixed, mixed]]
    batch, used = dapo_sync_batch(iter(rounds), train_groups=3, max_num_gen_batches=10)
    assert used == 2
    assert len(batch) == 3
    assert sum(len(g) for g in batch) == 3 * n
    assert all(dapo_keep(g) for g in batch)


def test_sync_batch_raises_after_max_rounds() -> None:
    flat = [[0.0, 0.0]] * 5
    with pytest.raises(TooManyGenerationRounds, match="generated 3 rounds"):
        dapo_sync_batch(iter([flat] * 10), train_groups=2, max_num_gen_batches=3)
    with pytest.raises(ValueError, match="ran out"):  # M <= 0: unlimited
        dapo_sync_batch(iter([flat] * 10), train_groups=2, max_num_gen_batches=0)


def test_streaming_trains_only_non_zero_variance_groups() -> None:
    tasks = make_tasks(40)
    sim = Sim(build("dapo", tasks), mixed_probs(tasks), cut_prob=0.1, seed=2).run(400).drain()
    stats = sim.allocator.statistics()
    assert sim.emitted
    assert all(len(g.trajectories) == 8 for g in sim.emitted)
    assert all(dapo_keep([t.reward for t in g.trajectories]) for g in sim.emitted)
    assert stats["allocator/groups_trained_zero_variance"] == 0
    assert stats["allocator/zero_variance_fraction"] > 0.4  # half the tasks are always / never solved
    assert stats["allocator/prompts_pending"] == 0


def test_streaming_paces_admission_by_expected_yield() -> None:
    tasks = make_tasks(8)
    allocator = build("dapo", tasks, batch_groups=2, lookahead_batches=0.0)
    started = []
    while (admission := allocator.next_admission(64)) is not None:
        allocator.on_admitted(len(started), admission)
        started.append(admission)
    assert len(started) == 2  # two groups in flight are expected to fill B = 2
    assert allocator.on_result(make_result(0, started[0].task_id, [True] * 8)) == []  # zero-variance
    assert allocator.next_admission(64) is not None  # the expected yield fell: admit again


def test_streaming_raises_when_nothing_trains_for_too_long() -> None:
    tasks = make_tasks(10)
    allocator = build("dapo", tasks, batch_groups=2, max_num_gen_batches=2, gen_batch_groups=3)
    sim = Sim(allocator, dict.fromkeys((t.task_id for t in tasks), 0.0), batch_groups=2)
    with pytest.raises(TooManyGenerationRounds, match="6 groups finished without filling a batch"):
        sim.run(50)
    assert sim.finished == 5  # the sixth raised


def test_streaming_unlimited_rounds_keep_going() -> None:
    tasks = make_tasks(10)
    allocator = build("dapo", tasks, batch_groups=2, max_num_gen_batches=0)
    sim = Sim(allocator, dict.fromkeys((t.task_id for t in tasks), 0.0), batch_groups=2).run(100)
    assert sim.emitted == []
    assert sim.finished == 100
