"""AllocatorBase: the bookkeeping every built-in shares, and what a custom allocator gets by subclassing it."""

from __future__ import annotations

import msgspec
import pytest

from gates.allocators import ALLOCATORS, Admission, AllocatorBase, AllocatorContext
from pipeline.messages import GroupResult

from .sim import Sim, make_result, make_tasks, mixed_probs


class EasiestFirst(AllocatorBase):
    """Only the `n` tasks with the fewest distractors; nothing but `next_admission` written."""

    name = "easiest"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        n: int = 5

    def __init__(self, options: Options, ctx: AllocatorContext) -> None:
        super().__init__(options, ctx)
        ranked = sorted(ctx.tasks, key=lambda t: (t.features["distractors"], t.task_id))
        self.easiest = [t.task_id for t in ranked[: options.n]]
        self.turn = 0

    def next_admission(self, free_slots: int) -> Admission | None:
        if not self.fits(self.ctx.group_size, free_slots):
            return None
        self.turn += 1
        return Admission(self.easiest[self.turn % len(self.easiest)], self.ctx.group_size)


def test_every_builtin_subclasses_the_base() -> None:
    for name in ALLOCATORS.names():
        assert issubclass(ALLOCATORS.get(name), AllocatorBase), name


def test_a_subclass_writing_only_next_admission_passes_the_simulator() -> None:
    tasks = make_tasks(30)
    ctx = AllocatorContext(tasks=tasks, group_size=8, batch_groups=8, seed=0)
    allocator = EasiestFirst(EasiestFirst.Options(n=4), ctx)
    sim = Sim(allocator, mixed_probs(tasks), cut_prob=0.2, seed=3).run(200).drain()
    stats = allocator.statistics()
    assert {task for _, a in sim.admissions for task in [a.task_id]} == set(allocator.easiest)
    assert stats["allocator/groups_trained"] == stats["allocator/groups_completed"] == len(sim.emitted)
    assert stats["allocator/prompts_dropped"] == stats["allocator/groups_cut"] > 0
    restored = EasiestFirst(EasiestFirst.Options(n=4), ctx)
    restored.load_state_dict(msgspec.json.decode(msgspec.json.encode(allocator.state_dict())))
    assert restored.statistics() == stats


def test_the_simulator_names_the_base_when_statistics_lack_the_ledger() -> None:
    class Bare:
        name = "bare"

        def statistics(self) -> dict[str, float]:
            return {}

    with pytest.raises(AssertionError, match="subclass gates.allocators.AllocatorBase"):
        Sim(Bare(), {})  # type: ignore[arg-type]


def test_in_flight_and_visits_follow_admissions() -> None:
    ctx = AllocatorContext(tasks=make_tasks(3), group_size=2, batch_groups=1, seed=0)
    allocator = EasiestFirst(EasiestFirst.Options(n=2), ctx)
    allocator.on_admitted(0, Admission("t000", 2))
    allocator.on_admitted(1, Admission("t000", 2, kind="rescue", parent=0))  # a follow-up: no new visit
    assert set(allocator.in_flight) == {0, 1}
    assert allocator.ledger.counts["prompts_admitted"] == 1
    out: list[GroupResult] = allocator.on_result(make_result(0, "t000", [True, False]))
    assert [g.group_id for g in out] == [0]
    assert set(allocator.in_flight) == {1}
    with pytest.raises(ValueError, match="easiest allocator: no tasks"):
        EasiestFirst(EasiestFirst.Options(), AllocatorContext(tasks=[], group_size=2, batch_groups=1, seed=0))
