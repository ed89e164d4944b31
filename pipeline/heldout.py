"""Held-out success measured during the GRPO phase, every `eval.every` learner updates.

`PeriodicHeldout` keeps the weights of each version due for a measure (a detached copy, taken when the
learner publishes them), runs `evaluate(version, weights)` in a nursery of the caller's while training goes
on, writes a `heldout/...` row to metrics.jsonl and keeps it for the summary and `learning_curve.png`.
The last version is left to the job's after-measure. `idle()` waits until no measure is in flight.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from .progress import Progress
from .rundir import MetricsWriter

Evaluate = Callable[[int, Mapping[str, Any]], Awaitable[dict[str, float]]]


class PeriodicHeldout:
    def __init__(self, evaluate: Evaluate | None, every: int, last_update: int, metrics: MetricsWriter,
                 progress: Progress | None, *, on_row: Callable[[dict[str, Any], float], None], target: float = 0.0) -> None:
        self.evaluate, self.every, self.last_update, self.target = evaluate, every, last_update, target
        self.metrics, self.progress, self.on_row = metrics, progress, on_row
        self.target_reached = trio.Event()
        self._due: dict[int, Mapping[str, Any]] = {}
        self._running = 0
        self._idle = trio.Event()
        self._idle.set()

    def published(self, version: int, state: Mapping[str, Any]) -> None:
        """The learner published `version`: keep its weights if a measure is due for it."""
        if self.evaluate is not None and self.every and version % self.every == 0 and version < self.last_update:
            self._due[version] = state  # a detached copy: the trainer goes on with its own tensors

    def start_if_due(self, version: int, nursery: trio.Nursery, *, wall_s: Callable[[], float], env_steps: Callable[[], int]) -> None:
        if version in self._due:
            nursery.start_soon(self._measure, version, self._due.pop(version), wall_s, env_steps)

    async def idle(self) -> None:
        await self._idle.wait()

    async def _measure(self, version: int, state: Mapping[str, Any], wall_s: Callable[[], float], env_steps: Callable[[], int]) -> None:
        assert self.evaluate is not None
        if self._running == 0:
            self._idle = trio.Event()
        self._running += 1
        try:
            t0 = trio.current_time()
            scores = await self.evaluate(version, state)
            spent = trio.current_time() - t0
            row = {"iteration": version, "wall_s": wall_s(), "env_steps": env_steps(), "eval_s": spent}
            row |= {f"heldout/{k}": v for k, v in scores.items()}
            self.on_row(row, spent)
            self.metrics.write(row)
            if self.progress is not None:
                self.progress.message(f"held-out success at update {version}: " + ", ".join(f"{k} {v:.1%}" for k, v in scores.items()))
            if self.target and scores.get("mean", 0.0) >= self.target:
                self.target_reached.set()
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()
