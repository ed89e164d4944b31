"""Uniform: G rollouts per prompt, every complete group trains, cut groups never do."""

from __future__ import annotations

from .sim import Sim, build, make_tasks, mixed_probs


def test_streaming_every_complete_group_trains() -> None:
    tasks = make_tasks(30)
    sim = Sim(build("uniform", tasks), mixed_probs(tasks), cut_prob=0.2, seed=1).run(300).drain()
    stats = sim.allocator.statistics()
    assert all(a.size == 8 for _, a in sim.admissions)
    assert all(len(g.trajectories) == 8 for g in sim.emitted)
    assert stats["allocator/groups_trained"] == stats["allocator/groups_completed"]
    assert stats["allocator/prompts_dropped"] == stats["allocator/groups_cut"] > 0
    assert stats["allocator/epoch"] >= 9  # 300+ groups over 30 tasks: it cycles
