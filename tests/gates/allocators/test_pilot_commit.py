"""Pilot-Commit: band edges, eviction, flush, max-variance down-sampling; then the two-queue streaming."""

from __future__ import annotations

import pytest

from gates.allocators.pilot_commit import (
    COMMIT,
    TOO_EASY,
    TOO_HARD,
    flush_expired,
    max_variance_subset,
    pilot_decision,
    should_evict,
)

from .sim import Sim, build, make_result, make_tasks, mixed_probs


@pytest.mark.parametrize(
    ("m", "decision"),
    [
        (0.125, COMMIT),
        (0.75, COMMIT),
        (0.5, COMMIT),
        (0.78, TOO_EASY),
        (1.0, TOO_EASY),
        (0.12, TOO_HARD),
        (0.0, TOO_HARD),
    ],
)
def test_band_is_inclusive_at_both_edges(m: float, decision: str) -> None:
    assert pilot_decision(m, p_lo=0.125, p_up=0.25) == decision


def test_evict_iff_m_reaches_the_threshold() -> None:
    assert should_evict(1.0, 1.0)
    assert not should_evict(0.97, 1.0)
    assert not should_evict(1.0, None)


def test_flush_deletes_iff_older_than_max_off_steps() -> None:
    added = {1: 0, 2: 1, 3: 5}
    assert flush_expired(added, step=5, max_off_steps=4) == [1]  # 5 − 1 = 4 is kept
    assert flush_expired(added, step=6, max_off_steps=4) == [1, 2]


@pytest.mark.parametrize(
    ("positive", "m", "n_pos", "n_neg"),
    [
        ([1, 1, 1, 0, 0, 0], 4, 2, 2),
        ([1, 0, 0, 0, 0, 0], 4, 1, 3),
        ([1, 1, 1, 1, 1, 0], 4, 3, 1),
        ([1, 1, 0, 0], 3, 1, 2),
        ([1, 1, 0], 3, 2, 1),
    ],
)
def test_max_variance_subset_balances_then_tops_up(
    positive: list[int], m: int, n_pos: int, n_neg: int
) -> None:
    chosen = max_variance_subset([bool(p) for p in positive], m)
    assert len(chosen) == m == len(set(chosen))
    assert sum(positive[i] for i in chosen) == n_pos
    assert sum(1 - positive[i] for i in chosen) == n_neg


def _pilot(allocator, gid: int, successes: list[bool]) -> str:
    admission = allocator.next_admission(64)
    assert admission.kind == "pilot"
    allocator.on_admitted(gid, admission)
    assert allocator.on_result(make_result(gid, admission.task_id, successes)) == []
    return admission.task_id


def test_commit_is_served_first_and_trains_pilot_plus_commit() -> None:
    allocator = build("pilot_commit", make_tasks(6))  # G = 8: 4 pilots + 4 commits
    task = _pilot(allocator, 0, [True, False, False, True])
    commit = allocator.next_admission(64)
    assert (commit.task_id, commit.size, commit.kind, commit.parent) == (task, 4, "commit", 0)
    allocator.on_admitted(1, commit)
    [group] = allocator.on_result(make_result(1, task, [False, False, False, True]))
    assert group.group_id == 0
    assert [t.success for t in group.trajectories] == [True, False, False, True, False, False, False, True]


def test_waiting_commit_blocks_new_pilots_until_it_fits() -> None:
    allocator = build("pilot_commit", make_tasks(6))
    _pilot(allocator, 0, [True, False, False, False])
    other = allocator.next_admission(64)  # the commit
    allocator.on_admitted(1, other)
    _pilot(allocator, 2, [True, True, False, False])  # a second survivor queues
    assert allocator.next_admission(3) is None  # its commit needs 4 slots; no pilot overtakes it
    assert allocator.next_admission(4).kind == "commit"


def test_solved_prompt_is_evicted_for_good() -> None:
    allocator = build("pilot_commit", make_tasks(3))
    solved = _pilot(allocator, 0, [True] * 4)
    later = []
    for gid in range(1, 12):
        admission = allocator.next_admission(64)
        allocator.on_admitted(gid, admission)
        allocator.on_result(make_result(gid, admission.task_id, [False] * 4))
        later.append(admission.task_id)
    assert solved not in later
    assert allocator.statistics()["allocator/prompts_evicted"] == 1


def test_everything_evicted_starts_over() -> None:
    allocator = build("pilot_commit", make_tasks(2))
    for gid in range(3):
        _pilot(allocator, gid, [True] * 4)
    assert allocator.statistics()["allocator/pilots_eviction_resets"] == 1


def test_waiting_pilot_expires_after_max_off_steps() -> None:
    allocator = build("pilot_commit", make_tasks(4), max_off_steps=2)
    _pilot(allocator, 0, [True, False, True, False])
    for version in (1, 2):
        allocator.on_update(version)
    assert allocator.statistics()["allocator/commit_queue"] == 1  # 2 − 0 = 2 is kept
    allocator.on_update(3)
    stats = allocator.statistics()
    assert stats["allocator/commit_queue"] == 0
    assert stats["allocator/pilots_expired"] == 1
    assert stats["allocator/prompts_dropped"] == 1
    assert allocator.next_admission(64).kind == "pilot"


class _CommitsFirst:
    """Delegates to a pilot_commit allocator and checks no pilot is handed out while a commit waits."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.pilots_while_queued = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def next_admission(self, free_slots: int) -> object:
        queued = self.inner.statistics()["allocator/commit_queue"]
        admission = self.inner.next_admission(free_slots)
        if admission is not None and admission.kind == "pilot" and queued:
            self.pilots_while_queued += 1
        return admission


@pytest.mark.parametrize(
    ("options", "size"), [({}, 8), ({"n_pilot": 6, "n_commit": 10, "n_effective": 4}, 14)]
)
def test_streaming(options: dict[str, int], size: int) -> None:
    tasks = make_tasks(60)
    allocator = _CommitsFirst(build("pilot_commit", tasks, **options))
    sim = Sim(allocator, mixed_probs(tasks), cut_prob=0.1, seed=4).run(500).drain()
    assert allocator.pilots_while_queued == 0
    stats = allocator.statistics()
    assert sim.emitted
    assert all(len(g.trajectories) == size for g in sim.emitted)
    assert all(0 < sum(t.success for t in g.trajectories) < size for g in sim.emitted)  # pilot was mixed
    kinds = {a.kind for _, a in sim.admissions}
    assert kinds == {"pilot", "commit"}
    assert stats["allocator/pilots_too_easy"] > 0
    assert stats["allocator/pilots_too_hard"] > 0
    assert stats["allocator/prompts_evicted"] > 0
    # every commit extends a pilot admitted earlier
    order = {gid: i for i, (gid, _) in enumerate(sim.admissions)}
    commits = [(gid, a) for gid, a in sim.admissions if a.kind == "commit"]
    assert all(order[a.parent] < order[gid] for gid, a in commits)
