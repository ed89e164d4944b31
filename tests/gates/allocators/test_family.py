"""Family weighting: families whose groups come back zero-variance get fewer slots, none gets none."""

from __future__ import annotations

import pytest

from gates.allocators import check_allocator
from gates.allocators.family import family_weights

from .sim import Sim, build, make_result, make_tasks


def test_weights_follow_the_mixed_rate_times_the_task_share() -> None:
    # shares 1/2, 1/4, 1/4; rates (3+1)/(4+2), (0+1)/(8+2) -> floor 0.2, (1+1)/(2+2)
    w = family_weights([0.5, 0.25, 0.25], [4, 8, 2], [3, 0, 1], prior=1.0, floor=0.2, power=1.0)
    raw = [0.5 * 4 / 6, 0.25 * 0.2, 0.25 * 0.5]
    assert w == pytest.approx([r / sum(raw) for r in raw])
    assert family_weights([0.5, 0.5], [9, 0], [0, 0], prior=1.0, floor=0.1, power=0.0) == pytest.approx([0.5, 0.5])


def test_a_family_whose_groups_never_vary_gets_few_slots_but_not_none() -> None:
    tasks = make_tasks(60)  # families pick / clean / heat, 20 tasks each
    probs = {t.task_id: 0.0 if t.family == "pick" else 0.5 for t in tasks}  # pick: always all-fail
    sim = Sim(build("family", tasks, floor=0.05), probs, seed=3).run(600)
    picked = [a for _, a in sim.admissions[-300:] if a.task_id in {t.task_id for t in tasks if t.family == "pick"}]
    stats = sim.allocator.statistics()
    assert stats["allocator/weight/pick"] < 0.1  # uniform would be 1/3
    assert 0 < len(picked) < 0.15 * 300
    assert stats["allocator/weight/clean"] == pytest.approx(stats["allocator/weight/heat"], abs=0.05)


def test_equal_families_are_drawn_like_uniform_and_every_task_in_turn() -> None:
    tasks = make_tasks(30)
    sim = Sim(build("family", tasks), {t.task_id: 0.5 for t in tasks}, seed=1).run(300)
    firsts = [a.task_id for _, a in sim.admissions[:30]]
    assert len(set(firsts)) > 20  # each family cycles through its tasks, no repeats before a pass ends
    shares = [v for k, v in sim.allocator.statistics().items() if k.startswith("allocator/admitted_share/")]
    assert len(shares) == 3 and all(abs(s - 1 / 3) < 0.08 for s in shares)


def test_counts_decay_per_update_so_a_family_can_come_back() -> None:
    tasks = make_tasks(30)
    allocator = build("family", tasks, decay=0.5)
    pick = next(t.task_id for t in tasks if t.family == "pick")
    for gid in range(20):
        allocator.on_admitted(gid, allocator.next_admission(8) or pytest.fail("no admission"))
        allocator.on_result(make_result(gid, pick, [False] * 8))
    low = allocator.statistics()["allocator/weight/pick"]
    for version in range(1, 8):
        allocator.on_update(version)
    assert allocator.statistics()["allocator/weight/pick"] > 2 * low


def test_cut_groups_are_not_counted() -> None:
    tasks = make_tasks(30)
    allocator = build("family", tasks)
    before = allocator.statistics()["allocator/weight/pick"]
    pick = next(t.task_id for t in tasks if t.family == "pick")
    allocator.on_admitted(0, allocator.next_admission(8) or pytest.fail("no admission"))
    assert allocator.on_result(make_result(0, pick, [False] * 8, cut=True)) == []
    assert allocator.statistics()["allocator/weight/pick"] == before


def test_bad_options_are_each_named() -> None:
    problems = check_allocator("family", {"decay": 0.0, "floor": 2.0, "power": -1.0, "nope": 1})
    assert len(problems) == 4
    assert any("decay" in p for p in problems) and any("floor" in p for p in problems)
    assert any("power" in p for p in problems) and any("nope" in p for p in problems)
