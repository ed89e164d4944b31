"""Checkpoints: every allocator's state is JSON, and a restored allocator carries on exactly as the original."""

from __future__ import annotations

import json

import pytest

from .sim import Sim, build, make_tasks, mixed_probs

BUILTINS = ["aero", "dapo", "family", "greso", "pilot_commit", "uniform", "vip"]


@pytest.mark.parametrize("name", BUILTINS)
def test_restored_allocator_continues_identically(name: str) -> None:
    tasks = make_tasks(24)
    probs = mixed_probs(tasks) | {t.task_id: 0.1 for t in tasks[::5]}
    original = build(name, tasks, batch_groups=4, seed=11)
    first = Sim(original, probs, batch_groups=4, cut_prob=0.1, seed=1).run(150).drain()

    state = json.loads(json.dumps(original.state_dict()))
    restored = build(name, tasks, batch_groups=4, seed=999)  # a different seed: the state must carry the rng
    restored.load_state_dict(state)
    assert restored.statistics() == original.statistics()

    def resume(allocator) -> Sim:
        sim = Sim(allocator, probs, batch_groups=4, cut_prob=0.1, seed=2, next_gid=first.next_gid)
        sim.ready = first.ready
        return sim.run(150)

    a, b = resume(original), resume(restored)
    assert a.admissions == b.admissions
    assert a.emitted == b.emitted
    assert a.allocator.statistics() == b.allocator.statistics()
    assert len(a.emitted) > 0


@pytest.mark.parametrize("name", BUILTINS)
def test_groups_in_flight_at_a_checkpoint_count_as_lost(name: str) -> None:
    tasks = make_tasks(24)
    original = build(name, tasks, batch_groups=4)
    sim = Sim(original, mixed_probs(tasks), batch_groups=4).run(40)
    sim.fill()
    assert sim.in_flight
    restored = build(name, tasks, batch_groups=4)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    before, after = original.statistics(), restored.statistics()
    assert after["allocator/groups_lost"] == len(sim.in_flight)
    assert after["allocator/prompts_pending"] <= before["allocator/prompts_pending"]
    assert after["allocator/prompts_admitted"] == (
        after["allocator/prompts_trained"]
        + after["allocator/prompts_dropped"]
        + after["allocator/prompts_pending"]
    )
    Sim(restored, mixed_probs(tasks), batch_groups=4, next_gid=sim.next_gid).run(60)  # and it runs on
