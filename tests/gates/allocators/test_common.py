"""The shared pieces: task cycle, ledger identities, pacing, merging groups, slot fitting."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.allocators import Ledger, TaskCycle
from gates.allocators._common import (
    YieldPacer,
    is_zero_variance,
    merge_groups,
    require_fit,
    subset,
    trainable,
)

from .sim import make_result


def test_task_cycle_visits_every_task_once_per_epoch() -> None:
    cycle = TaskCycle(["a", "b", "c"], random.Random(0))
    first = [cycle.next() for _ in range(3)]
    assert sorted(first) == ["a", "b", "c"]
    assert cycle.epoch == 0
    second = [cycle.next() for _ in range(3)]
    assert sorted(second) == ["a", "b", "c"]
    assert cycle.epoch == 1


def test_merge_groups_renumbers_and_keeps_the_first_group_id() -> None:
    pilot = make_result(7, "t", [True, False])
    commit = make_result(9, "t", [False, False, True])
    merged = merge_groups(pilot, commit)
    assert merged.group_id == 7
    assert [t.rollout_index for t in merged.trajectories] == [0, 1, 2, 3, 4]
    assert [t.success for t in merged.trajectories] == [True, False, False, False, True]
    assert [t.rollout_index for t in subset(merged, [4, 1]).trajectories] == [0, 1]
    assert [t.success for t in subset(merged, [4, 1]).trajectories] == [True, False]


def test_zero_variance_and_trainable() -> None:
    assert is_zero_variance([1.0, 1.0])
    assert is_zero_variance([])
    assert not is_zero_variance([0.0, 0.5])
    assert trainable(make_result(1, "t", [True]))
    assert not trainable(make_result(1, "t", [True], cut=True))


def test_ledger_identity_and_checkpoint_accounting() -> None:
    ledger = Ledger()
    for _ in range(3):
        ledger.admitted(8, new_prompt=True)
    ledger.admitted(4, new_prompt=False)  # a follow-up of one of them
    ledger.finished(make_result(1, "t", [True] * 8))
    ledger.dropped()
    ledger.trained(make_result(2, "t", [True, False]))
    assert ledger.pending == 1
    assert ledger.in_flight == 3
    stats = ledger.statistics()
    assert stats["allocator/rollouts_spent"] == 28
    assert stats["allocator/zero_variance_fraction"] == 1.0
    assert stats["allocator/effective_prompt_ratio"] == pytest.approx(1 / 3)
    restored = Ledger()
    restored.load_state_dict(ledger.state_dict(pending_kept=0))
    assert restored.pending == 0
    assert restored.in_flight == 0
    assert restored.counts["prompts_dropped"] == 2
    assert restored.counts["groups_lost"] == 3


def test_require_fit_waits_only_while_something_is_in_flight() -> None:
    assert require_fit(8, 8, in_flight=0, who="x")
    assert not require_fit(8, 4, in_flight=1, who="x")
    with pytest.raises(ValueError, match="raise rollout.slots"):
        require_fit(8, 4, in_flight=0, who="x")


@given(
    batch=st.integers(1, 16),
    lookahead=st.floats(0, 2),
    ready=st.integers(0, 40),
    sure=st.integers(0, 40),
    yields=st.lists(st.booleans(), max_size=50),
)
def test_pacer_never_refuses_with_nothing_in_flight(
    batch: int, lookahead: float, ready: int, sure: int, yields: list[bool]
) -> None:
    pacer = YieldPacer(batch, lookahead)
    for y in yields:
        pacer.observe(y)
    pacer.emitted(ready)
    assert pacer.admit(0, sure)
    assert pacer.admit(0, sure, in_flight=0)
    if not pacer.admit(1, sure):
        assert pacer.need(sure) == 0 or pacer.yield_rate >= pacer.need(sure)


def test_pacer_counts_expected_yield() -> None:
    pacer = YieldPacer(batch_groups=4, lookahead=0.0)
    for y in (True, False):
        pacer.observe(y)
    assert pacer.yield_rate == 0.5
    assert pacer.admit(7)
    assert not pacer.admit(8)
    pacer.emitted(4)
    assert not pacer.admit(1)  # a batch is ready
    assert pacer.admit(0)  # ... but nothing is in flight: never stall
    pacer.updated()
    assert pacer.admit(1)
