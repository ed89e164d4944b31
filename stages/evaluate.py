"""Success of any `Policy` on a list of tasks: many concurrent episodes over `act()`.

Backend-independent (it only needs the `Policy` protocol, with `serve()` already running) and reused by
the runtime for its held-out measures. `evaluate_splits` plays every episode of every split at once, so
a batching policy decodes them together (the cheap way to measure >= 200 tasks per split often), and
shows its progress through `pipeline.progress.report`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import trio

from pipeline.progress import report
from stages.envs.base import EnvSuite, Task
from stages.episode import play_episode
from stages.policy.base import Policy


@dataclass(frozen=True, slots=True)
class EpisodeOutcome:
    task_id: str
    family: str
    won: bool
    steps: int


@dataclass(frozen=True, slots=True)
class EvalReport:
    success: float
    """Fraction of episodes won."""
    per_family: dict[str, float]
    """Success per task family."""
    mean_steps: float
    episodes: tuple[EpisodeOutcome, ...]


async def run_episode(policy: Policy, suite: EnvSuite, task: Task, *, greedy: bool = True) -> EpisodeOutcome:
    """Play one episode of `task` (at most `suite.max_steps` steps) with `policy.act`."""
    env = suite.make()
    try:
        episode = await play_episode(policy, env, task, suite.max_steps, greedy=greedy)
    finally:
        env.close()
    return EpisodeOutcome(task.task_id, task.family, episode.won, episode.steps)


async def evaluate(
    policy: Policy, suite: EnvSuite, tasks: Sequence[Task], *, greedy: bool = True, concurrency: int | None = None
) -> EvalReport:
    """Play one episode per task, `concurrency` at a time (None = all at once); `serve()` must be running."""
    return (await evaluate_splits(policy, suite, {"evaluation": tasks}, greedy=greedy, concurrency=concurrency))[
        "evaluation"
    ]


async def evaluate_splits(
    policy: Policy,
    suite: EnvSuite,
    splits: Mapping[str, Sequence[Task]],
    *,
    greedy: bool = True,
    concurrency: int | None = None,
    label: str = "held-out",
) -> dict[str, EvalReport]:
    """One report per split, every episode of every split played concurrently (at most `concurrency`
    at a time; None = all). The policy's `serve()` must be running. Progress goes to `report(label, ...)`:
    episodes finished (in place on a terminal), then one line with the success per split."""
    runs = [(split, task) for split, tasks in splits.items() for task in tasks]
    outcomes: list[EpisodeOutcome | None] = [None] * len(runs)
    limiter = trio.CapacityLimiter(concurrency or max(1, len(runs)))
    started = time.perf_counter()
    finished = won = 0

    async def one(i: int) -> None:
        nonlocal finished, won
        async with limiter:
            outcome = outcomes[i] = await run_episode(policy, suite, runs[i][1], greedy=greedy)
        finished, won = finished + 1, won + outcome.won
        report(label, finished, len(runs), f"{won} won | {time.perf_counter() - started:.0f} s")

    async with trio.open_nursery() as nursery:
        for i in range(len(runs)):
            nursery.start_soon(one, i)
    reports = {
        split: summarize([o for (s, _), o in zip(runs, outcomes, strict=True) if s == split and o is not None])
        for split in splits
    }
    figures = ", ".join(f"{split} {r.success:.1%}" for split, r in reports.items())
    if runs:
        report(label, finished, len(runs), f"{figures} | {time.perf_counter() - started:.0f} s", final=True)
    return reports


def summarize(outcomes: Sequence[EpisodeOutcome]) -> EvalReport:
    by_family: dict[str, list[bool]] = defaultdict(list)
    for o in outcomes:
        by_family[o.family].append(o.won)
    n = max(1, len(outcomes))
    return EvalReport(
        success=sum(o.won for o in outcomes) / n,
        per_family={f: sum(w) / len(w) for f, w in sorted(by_family.items())},
        mean_steps=sum(o.steps for o in outcomes) / n,
        episodes=tuple(outcomes),
    )
