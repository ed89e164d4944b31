"""The learner stage: training groups in over ZMQ, GRPO updates in a worker thread, weights out.

A receiver task pulls `GroupResult`s from the results socket into a bounded channel; the training task
filters them (cut groups are refused and counted — they must never get here; zero-variance groups are
dropped by default), gathers batches of B groups, runs `Trainer.update` in a worker thread (the Trio loop
never blocks on torch) and hands the new weights to the policy with a version number.

Cancellation: `trio.to_thread.run_sync` does not abandon the thread, so a shutdown waits for the current
update (a few seconds at most on the default model) and loses no weights half-written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
import trio

from pipeline.config import LearnerSection
from pipeline.messages import GroupResult, ResultStream
from pipeline.outcomes import is_zero_variance, label_rewards
from pipeline.stage import StageContext

from .trainer import Trainer
from .validation import group_problem

log = structlog.get_logger(__name__)


@dataclass
class LearnerReport:
    """What happened in one update (the runtime turns it into a metrics.jsonl line)."""

    version: int
    groups: list[GroupResult]
    stats: Mapping[str, float]
    dropped_since_last: int
    train_seconds: float


@dataclass
class LearnerCounters:
    groups_received: int = 0
    groups_trained: int = 0
    groups_dropped_zero_variance: int = 0
    cut_groups_refused: int = 0
    updates: int = 0


class LearnerStage:
    name = "learner"

    def __init__(
        self,
        trainer: Trainer,
        cfg: LearnerSection,
        *,
        publish: Callable[[int, dict[str, Any]], None],
        on_consumed: Callable[[int], None],
        on_update: Callable[[LearnerReport], Any],
    ) -> None:
        """
        Args:
            publish: `(version, state)` -> load the weights into the policy (between its batches).
            on_consumed: `n` training groups were used up (trained or dropped): frees staleness budget.
            on_update: called (and awaited if it returns an awaitable) after every published update.
        """
        self.trainer = trainer
        self.cfg = cfg
        self.publish = publish
        self.on_consumed = on_consumed
        self.on_update = on_update
        self.version = 0
        self.counters = LearnerCounters()
        self._limiter = trio.CapacityLimiter(1)
        self._expected: set[int] = set()
        """Training groups the runtime announced and the socket has not delivered yet (bounded by staleness)."""

    def expect(self, group_id: int) -> None:
        """The runtime is about to send training group `group_id`: accept it once."""
        self._expected.add(group_id)

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        results = ctx.zmq.socket(
            "pull", ctx.addresses.results, bind=True, receives=ResultStream, hwm=ctx.addresses.hwm, name="results"
        )
        send, receive = trio.open_memory_channel[GroupResult](4 * self.cfg.batch_groups)
        async with results, trio.open_nursery() as nursery:
            nursery.start_soon(self._receive, results, send)
            task_status.started()
            await self._train(receive, ctx)

    async def _receive(self, results: Any, send: trio.MemorySendChannel[GroupResult]) -> None:
        async with send:
            async for group in results:
                reason = "unknown_group" if group.group_id not in self._expected else group_problem(group)
                if reason is not None:
                    results.drop(reason, f"group {group.group_id}")
                    continue
                self._expected.discard(group.group_id)
                await send.send(group)

    def _accept(self, group: GroupResult) -> bool:
        self.counters.groups_received += 1
        if group.cut:
            self.counters.cut_groups_refused += 1
            log.error("learner.cut_group_refused", group_id=group.group_id)
            return False
        if self.cfg.drop_zero_variance and is_zero_variance(label_rewards(group)):
            self.counters.groups_dropped_zero_variance += 1
            return False
        return True

    async def _train(self, receive: trio.MemoryReceiveChannel[GroupResult], ctx: StageContext) -> None:
        batch: list[GroupResult] = []
        dropped = 0
        async with receive:
            async for group in receive:
                if not self._accept(group):
                    dropped += 1
                    self.on_consumed(1)
                    continue
                batch.append(group)
                if len(batch) < self.cfg.batch_groups:
                    continue
                started = trio.current_time()
                with ctx.profiler.span("learner", "train_step"):
                    state, stats = await trio.to_thread.run_sync(
                        self._update, batch, self.version, ctx.profiler, limiter=self._limiter
                    )
                self.version += 1
                with ctx.profiler.span("learner", "weight_publish"):
                    self.publish(self.version, state)
                self.counters.updates += 1
                self.counters.groups_trained += len(batch)
                report = LearnerReport(self.version, batch, stats, dropped, trio.current_time() - started)
                self.on_consumed(len(batch))
                batch, dropped = [], 0
                maybe_awaitable = self.on_update(report)
                if maybe_awaitable is not None:
                    await maybe_awaitable

    def _update(self, batch: list[GroupResult], version: int, profiler: Any) -> tuple[dict[str, Any], dict[str, float]]:
        """Runs in the worker thread: its CPU time is attributed to the learner stage."""
        with profiler.bind_thread("learner"):
            return self.trainer.update(batch, version=version)
