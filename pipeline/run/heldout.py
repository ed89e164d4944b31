"""Held-out success measured during the GRPO phase, every `eval.every` learner updates.

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

from pipeline.progress import Progress
from pipeline.rundir import MetricsWriter

Evaluate = Callable[[int, Mapping[str, Any]], Awaitable[dict[str, float]]]


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
