"""Held-out success: which tasks a run measures (`heldout_tasks` before and after GRPO, `curve_tasks` during
it), how (`evaluate_heldout`, `periodic_evaluator`), and the measure during the GRPO phase, every `eval.every`
learner updates.

`PeriodicHeldout` keeps the weights of each version due for a measure (a detached copy, taken when the
learner publishes them), runs `evaluate(version, weights)` in a nursery of the caller's while training goes
on, writes a `heldout/...` row to metrics.jsonl and keeps it for the summary and `learning_curve.png`.
The last version is left to the job's after-measure. `idle()` waits until no measure is in flight.

A row is stamped with the GRPO wall clock and env steps at which its weights were *published*, not when
its measure finished: measures queue behind one evaluator, and a stamp at the finish would make a fast
run's curve (and its time to a target) look later than it is. `heldout_range` names the task range
measured (`eval.curve_range`: valid by default, never test).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from pipeline.config import RunConfig
from pipeline.progress import Progress
from pipeline.rundir import MetricsWriter
from pipeline.task_ranges import heldout_ranges
from stages.envs import EnvSuite, Task
from stages.evaluate import EvalReport, evaluate_splits
from stages.policy import Policy

from . import build

Evaluate = Callable[[int, Mapping[str, Any]], Awaitable[dict[str, float]]]


def heldout_tasks(cfg: RunConfig, suite: EnvSuite) -> dict[str, list[Task]]:
    """The before/after measure's tasks: the first `eval.tasks` of range `eval.range` of each eval split
    (`pipeline/task_ranges.py`); a split with none there is left out with a warning (not "0.0%")."""
    if not cfg.eval.tasks:
        return {}
    return heldout_ranges(suite.tasks, cfg.eval.splits, cfg.eval.range, cfg.eval.sizes(), cfg.eval.tasks,
                          verdict=cfg.eval.verdict)


def curve_tasks(cfg: RunConfig, suite: EnvSuite) -> dict[str, list[Task]]:
    """The periodic measure's tasks (`eval.every`, and the stop rule): the first `eval.curve_tasks` of range
    `eval.curve_range` of each eval split (never test)."""
    count = cfg.eval.periodic_tasks()
    if not (cfg.eval.every and count):
        return {}
    return heldout_ranges(suite.tasks, cfg.eval.splits, cfg.eval.curve_range, cfg.eval.sizes(), count)


async def evaluate_heldout(policy: Policy, suite: EnvSuite, splits: dict[str, list[Task]], greedy: bool) -> dict[str, EvalReport]:
    if not splits:  # nothing to measure (`eval.tasks = 0`): no serve, so no decoders placed (engines started) for it
        return {}
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        reports = await evaluate_splits(policy, suite, splits, greedy=greedy)  # all splits' episodes at once
        nursery.cancel_scope.cancel("evaluation finished")
    return reports


def periodic_evaluator(cfg: RunConfig, suite: EnvSuite, splits: dict[str, list[Task]], built: list[Policy]) -> Any:
    """`evaluate(version, weights)` for the GRPO phase: a second policy of the same backend (the cached
    warm start), loaded with exactly that version's weights, so the figure is that version's whatever the
    live policy loads meanwhile. The policy is added to `built`, which the job closes."""
    holder: list[Policy] = []
    one_at_a_time = trio.Lock()  # one evaluation policy: evaluations that overlap (small eval.every) take turns

    async def evaluate_version(version: int, state: Any) -> dict[str, float]:
        async with one_at_a_time:
            if not holder:
                holder.append(await trio.to_thread.run_sync(lambda: build.policy(cfg, suite, workers=1)))
                built.append(holder[0])
            policy = holder[0]
            policy.load_weights(version, state)
            reports = await evaluate_heldout(policy, suite, splits, cfg.eval.greedy)
        scores = {split.removeprefix("heldout_"): r.success for split, r in reports.items()}
        mean = mean_success(reports)
        return scores | ({"mean": mean} if mean is not None else {})

    return evaluate_version


def mean_success(reports: dict[str, EvalReport]) -> float | None:
    """Episodes won over all the splits' episodes (None: none measured)."""
    episodes = [e for r in reports.values() for e in r.episodes]
    return sum(e.won for e in episodes) / len(episodes) if episodes else None


class PeriodicHeldout:
    def __init__(self, evaluate: Evaluate | None, every: int, last_update: int, metrics: MetricsWriter,
                 progress: Progress | None, *, on_row: Callable[[dict[str, Any], float], None], target: float = 0.0,
                 range_name: str = "valid") -> None:
        self.evaluate, self.every, self.last_update, self.target = evaluate, every, last_update, target
        self.metrics, self.progress, self.on_row, self.range_name = metrics, progress, on_row, range_name
        self.target_reached = trio.Event()
        self._due: dict[int, _Due] = {}
        self._running = 0
        self._idle = trio.Event()
        self._idle.set()

    def published(self, version: int, state: Mapping[str, Any], *, wall_s: float, env_steps: int,
                  generated_tokens: int | None = None) -> None:
        """The learner published `version` at GRPO wall second `wall_s`, after `env_steps` env steps and
        `generated_tokens` generated tokens: keep its weights and that stamp if a measure is due for it."""
        if self.evaluate is not None and self.every and version % self.every == 0 and version < self.last_update:
            self._due[version] = _Due(state, wall_s, env_steps, generated_tokens)  # a detached copy: the trainer goes on with its own tensors

    def start_if_due(self, version: int, nursery: trio.Nursery) -> None:
        if version in self._due:
            nursery.start_soon(self._measure, version, self._due.pop(version))

    async def idle(self) -> None:
        await self._idle.wait()

    async def _measure(self, version: int, due: _Due) -> None:
        assert self.evaluate is not None
        if self._running == 0:
            self._idle = trio.Event()
        self._running += 1
        try:
            t0 = trio.current_time()
            scores = await self.evaluate(version, due.state)
            spent = trio.current_time() - t0
            row = {"iteration": version, "wall_s": due.wall_s, "env_steps": due.env_steps, "eval_s": spent,
                   "heldout_range": self.range_name}
            if due.generated_tokens is not None:
                row["generated_tokens"] = due.generated_tokens
            row |= {f"heldout/{k}": v for k, v in scores.items()}
            self.on_row(row, spent)
            self.metrics.write(row)
            if self.progress is not None:
                self.progress.message(f"held-out success ({self.range_name}) at update {version}: "
                                      + ", ".join(f"{k} {v:.1%}" for k, v in scores.items()))
            if self.target and scores.get("mean", 0.0) >= self.target:
                self.target_reached.set()
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()


@dataclass(frozen=True, slots=True)
class _Due:
    """A version's weights kept for its measure, with the wall clock, env steps and tokens of its publication."""

    state: Mapping[str, Any]
    wall_s: float
    env_steps: int
    generated_tokens: int | None = None
