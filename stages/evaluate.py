"""Success of any `Policy` on a list of tasks: many concurrent episodes over `act()`.

Backend-independent (it only needs the `Policy` protocol, with `serve()` already running) and reused by
the runtime for its before / after held-out measure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from stages.envs.base import EnvSuite, Task
from stages.policy.base import AgentContext, Policy


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
        obs = env.reset(task)
        history: list[tuple[str, str]] = []
        won = False
        for _ in range(suite.max_steps):
            ctx = AgentContext(task.description, obs.text, obs.admissible, tuple(history))
            action = (await policy.act(ctx, greedy=greedy)).action
            step = env.step(action)
            history.append((obs.text, action))
            obs, won = step.observation, step.won
            if step.done:
                break
    finally:
        env.close()
    return EpisodeOutcome(task.task_id, task.family, won, len(history))


async def evaluate(
    policy: Policy, suite: EnvSuite, tasks: Sequence[Task], *, greedy: bool = True, concurrency: int = 64
) -> EvalReport:
    """Play one episode per task, `concurrency` at a time; the policy's `serve()` must be running."""
    outcomes: list[EpisodeOutcome | None] = [None] * len(tasks)
    limiter = trio.CapacityLimiter(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            outcomes[i] = await run_episode(policy, suite, tasks[i], greedy=greedy)

    async with trio.open_nursery() as nursery:
        for i in range(len(tasks)):
            nursery.start_soon(one, i)
    done = tuple(o for o in outcomes if o is not None)
    return summarize(done)


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
