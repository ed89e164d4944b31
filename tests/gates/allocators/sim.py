"""A fake streaming runtime for allocator tests: slots, Bernoulli rollouts, a learner that takes B groups.

It drives an allocator exactly as the runtime does (fill free slots with `next_admission` until None,
finish groups one at a time in random order, hand over training groups, update the learner) and checks the
contract after every call: admissions fit the free slots, no cut group is ever emitted, the run never
deadlocks, and the accounting identities of `statistics()` hold. The keys it reads are the public
`gates.allocators.Ledger`'s, which `AllocatorBase` keeps: an allocator that subclasses it has them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gates.allocators import Admission, Allocator, AllocatorContext, Ledger, build_allocator
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus
from stages.envs.base import Task

FAMILIES = ("pick", "clean", "heat")


def make_tasks(n: int) -> list[Task]:
    """n tasks over three families with two numeric features."""
    return [
        Task(
            task_id=f"t{i:03d}",
            family=FAMILIES[i % 3],
            description=f"task {i}",
            split="train",
            features={"rooms": float(1 + i % 4), "distractors": float(i % 5)},
        )
        for i in range(n)
    ]


def make_result(
    group_id: int, task_id: str, successes: Sequence[bool], *, cut: bool = False, reward: float | None = None
) -> GroupResult:
    """A finished group; rewards are 1/0 from `successes` unless a constant `reward` is given. Cut groups get
    truncated rewards (0) and CUT trajectories."""
    status = TrajectoryStatus.CUT if cut else TrajectoryStatus.COMPLETE
    trajectories = [
        Trajectory(
            rollout_index=i,
            turns=[],
            reward=0.0 if cut else (float(s) if reward is None else reward),
            success=bool(s) and not cut,
            status=status,
        )
        for i, s in enumerate(successes)
    ]
    return GroupResult(group_id=group_id, task_id=task_id, trajectories=trajectories, cut=cut)


@dataclass
class Sim:
    allocator: Allocator
    probs: Mapping[str, float]
    """Success probability of one rollout of each task."""
    slots: int = 64
    batch_groups: int = 8
    seed: int = 0
    cut_prob: float = 0.0
    update_prob: float = 0.5
    """Chance the learner updates right after a group finishes when a batch is ready (else it lags)."""
    admissions: list[tuple[int, Admission]] = field(default_factory=list)
    emitted: list[GroupResult] = field(default_factory=list)
    in_flight: dict[int, Admission] = field(default_factory=dict)
    finished: int = 0
    next_gid: int = 0
    version: int = 0
    ready: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.free = self.slots
        self.base = dict(self.allocator.statistics())
        """Counters at the start (a restored allocator carries its earlier counts)."""
        missing = sorted(set(Ledger().statistics()) - set(self.base))
        assert not missing, f"statistics() lacks {missing}: subclass gates.allocators.AllocatorBase (it keeps them)"

    def fill(self) -> None:
        while self.free > 0:
            admission = self.allocator.next_admission(self.free)
            if admission is None:
                return
            assert 1 <= admission.size <= self.free, admission
            assert admission.task_id in self.probs
            gid, self.next_gid = self.next_gid, self.next_gid + 1
            self.allocator.on_admitted(gid, admission)
            self.in_flight[gid] = admission
            self.free -= admission.size
            self.admissions.append((gid, admission))

    def finish_one(self) -> list[GroupResult]:
        gid = self.rng.choice(sorted(self.in_flight))
        admission = self.in_flight.pop(gid)
        self.free += admission.size
        p = self.probs[admission.task_id]
        successes = [self.rng.random() < p for _ in range(admission.size)]
        cut = self.rng.random() < self.cut_prob
        out = self.allocator.on_result(make_result(gid, admission.task_id, successes, cut=cut))
        self.finished += 1
        for group in out:
            assert not group.cut
            assert all(t.status != TrajectoryStatus.CUT for t in group.trajectories)
            assert [t.rollout_index for t in group.trajectories] == list(range(len(group.trajectories)))
        self.emitted += out
        # the learner drops zero-variance groups (learner.drop_zero_variance): they fill no batch
        self.ready += sum(len({t.reward for t in g.trajectories}) > 1 for g in out)
        self.check_accounting()
        return out

    def update(self) -> None:
        self.ready -= self.batch_groups
        self.version += 1
        self.allocator.on_update(self.version)

    def run(self, groups: int) -> Sim:
        """Finish `groups` more rollout groups, admitting and updating like the runtime."""
        target = self.finished + groups
        while self.finished < target:
            self.fill()
            if self.ready >= self.batch_groups and (
                not self.in_flight or self.rng.random() < self.update_prob
            ):
                self.update()
                continue
            assert self.in_flight, f"deadlock: nothing in flight, {self.ready} < B groups ready"
            self.finish_one()
        return self

    def drain(self) -> Sim:
        """Finish every group in flight without admitting more."""
        while self.in_flight:
            self.finish_one()
        return self

    def check_accounting(self) -> None:
        s = self.allocator.statistics()

        def delta(key: str) -> float:
            return s[f"allocator/{key}"] - self.base[f"allocator/{key}"]

        assert s["allocator/prompts_admitted"] == (
            s["allocator/prompts_trained"] + s["allocator/prompts_dropped"] + s["allocator/prompts_pending"]
        )
        assert delta("groups_trained") == len(self.emitted)
        assert delta("rollouts_spent") == sum(a.size for _, a in self.admissions)
        assert delta("rollouts_trained") == sum(len(g.trajectories) for g in self.emitted)
        assert delta("groups_admitted") == len(self.admissions)
        assert delta("groups_completed") + delta("groups_cut") == self.finished
        assert 0.0 <= s["allocator/zero_variance_fraction"] <= 1.0
        assert 0.0 <= s["allocator/effective_prompt_ratio"] <= 1.0


def mixed_probs(tasks: Sequence[Task]) -> dict[str, float]:
    """A spread of difficulties: a quarter always solved, a quarter never, the rest in between."""
    levels = (1.0, 0.0, 0.3, 0.6)
    return {t.task_id: levels[i % 4] for i, t in enumerate(tasks)}


def build(
    name: str,
    tasks: Sequence[Task],
    *,
    group_size: int = 8,
    batch_groups: int = 8,
    seed: int = 0,
    **options: object,
) -> Allocator:
    ctx = AllocatorContext(tasks=tasks, group_size=group_size, batch_groups=batch_groups, seed=seed)
    return build_allocator(name, options, ctx)
