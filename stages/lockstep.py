"""Many episodes played in lockstep, without Trio: one batched decision per step over those still running.

The offline counterpart of `stages.episode.play_episode` (which plays one episode through a policy
server): behaviour cloning's evaluation and DAgger (torch_tiny) and `make-model`'s evaluation (vLLM) play
hundreds of episodes with one batched forward pass per step. What differs between them is only how the
actions are chosen, so that is the one argument: `decide(step, live, contexts, envs)` returns an action
for each running episode (`live` indexes `tasks`; `envs` lets a caller label states with an expert).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.progress import report
from stages.envs.base import Environment, EnvSuite, Task
from stages.policy.base import AgentContext

Decide = Callable[[int, list[int], list[AgentContext], list[Environment]], list[str]]


@dataclass(frozen=True, slots=True)
class LockstepEpisode:
    task: Task
    won: bool
    steps: int
    actions: tuple[str, ...]


def play_lockstep(suite: EnvSuite, tasks: Sequence[Task], decide: Decide, *, label: str = "") -> list[LockstepEpisode]:
    """Play each of `tasks` once (repeat a task to play it several times), in the order given.

    A `label` reports progress (steps in place on a terminal, a line at the end) under that name.
    """
    envs = [suite.make() for _ in tasks]
    started = time.perf_counter()
    try:
        obs = [env.reset(task) for env, task in zip(envs, tasks, strict=True)]
        history: list[list[tuple[str, str]]] = [[] for _ in tasks]
        won = [False] * len(tasks)
        live = list(range(len(tasks)))
        for step in range(suite.max_steps):
            if not live:
                break
            contexts = [AgentContext(tasks[i].description, obs[i].text, obs[i].admissible, tuple(history[i])) for i in live]
            actions = decide(step, live, contexts, envs)
            still = []
            for i, action in zip(live, actions, strict=True):
                result = envs[i].step(action)
                history[i].append((obs[i].text, action))
                obs[i], won[i] = result.observation, result.won
                if not result.done:
                    still.append(i)
            live = still
            if label:
                report(label, len(tasks) - len(live), len(tasks), f"step {step + 1} | {sum(won)} won")
    finally:
        for env in envs:
            env.close()
    if label:
        elapsed = time.perf_counter() - started
        report(label, len(tasks), len(tasks), f"{sum(won)} won ({sum(won) / max(1, len(tasks)):.1%}) | {elapsed:.0f} s",
               final=True)
    return [LockstepEpisode(task, won[i], len(history[i]), tuple(a for _, a in history[i])) for i, task in enumerate(tasks)]
