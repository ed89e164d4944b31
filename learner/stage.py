"""The learner stage: training groups in over ZMQ, GRPO updates in a worker thread, reports out.

Message-driven both ways. In: `GroupResult`s from the results socket (a receiver task pulls them into a
bounded channel, dropping what the runtime did not announce and malformed groups). Out: a `LearnerReport`
per update (the new weights, the update's statistics, among them how many of the batch's groups had zero
reward variance, and, for checkpoints, the trainer's state at the update boundary) and a `GroupsConsumed` per group dropped without training (cut groups are refused and
counted: they must never get here; zero-variance groups are dropped by default; both are refused as they
arrive, while an update runs, so the runtime's staleness pacing can start other groups at once), sent to `reports` — a
bounded Trio channel that one runtime task consumes, or a socket when the learner runs in its own process
(`pipeline.run.processes`). The learner never calls into the runtime.

Announcements: the runtime announces each training group it sends. In-process it calls `expect(group_id)`
before sending; across processes (`announced_on_socket=True`) a `GroupExpected` frame precedes the group on
the same socket, so ordering holds without a second channel.

Updates run on one thread of the stage's own (`pipeline.own_thread.OwnThread`), `learner.thread_nice` below
the event loop's priority. Cancellation: the stage tells the update in progress to stop (`Trainer.stop`: at its
next micro-batch, seconds on a real LM, not the minutes of the whole update) and waits for its thread to return, so
nothing runs on after the stage; the part-done update is dropped (the checkpoint holds the last update boundary).
It starts no update past the run's last one (`last_version`), so the phase's normal end waits for none.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import structlog
import trio

from pipeline import memory
from pipeline.config import LearnerSection
from pipeline.counters import ZERO_VARIANCE_TRAINED, GroupsConsumed, LearnerReport
from pipeline.devices import new_stream, side_stream
from pipeline.messages import GroupExpected, GroupResult, LearnerInbox
from pipeline.outcomes import drop_reason, is_zero_variance, label_rewards
from pipeline.own_thread import OwnThread
from pipeline.stage import StageContext

from .trainer import Trainer
from .validation import group_problem

log = structlog.get_logger(__name__)


class ReportSink(Protocol):
    async def send(self, message: LearnerReport | GroupsConsumed, /) -> None: ...


class LearnerStage:
    name = "learner"

    def __init__(
        self, trainer: Trainer, cfg: LearnerSection, *, reports: ReportSink, version: int = 0,
        capture_state: bool = True, announced_on_socket: bool = False, last_version: int | None = None,
    ) -> None:
        """
        Args:
            reports: where `LearnerReport`s and `GroupsConsumed` go (bounded: a slow runtime slows the learner).
            version: the policy version the trainer's weights are (a resumed run's last update).
            capture_state: put `Trainer.state_dict()` in each report (taken in the update's thread).
            announced_on_socket: accept `GroupExpected` frames from the results socket (see the module doc).
            last_version: the run's last update (`run.updates`): no update starts once the weights are that version;
                a group arriving after it is `GroupsConsumed(reason="run_ended")`. The runtime ends the phase on that
                update's report, and an update started past it (minutes on a real LM) would only delay the end,
                its weights never published.
        """
        self.trainer = trainer
        self.cfg = cfg
        self.reports = reports
        self.version = version
        self.capture_state = capture_state
        self.announced_on_socket = announced_on_socket
        self.last_version = last_version
        self._thread = OwnThread("rollcut-learner", nice=cfg.thread_nice)
        self._stream: Any = None  # the learner's CUDA stream, made on its first update on CUDA
        self._expected: set[int] = set()
        """Training groups announced and not delivered yet (bounded by the staleness bound)."""

    def expect(self, group_id: int) -> None:
        """The runtime is about to send training group `group_id`: accept it once."""
        self._expected.add(group_id)

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        results = ctx.zmq.socket(
            "pull", ctx.addresses.results, bind=True, receives=LearnerInbox, hwm=ctx.addresses.hwm, name="results"
        )
        send, receive = trio.open_memory_channel[GroupResult](4 * self.cfg.batch_groups)
        try:
            async with results, trio.open_nursery() as nursery:
                nursery.start_soon(self._receive, results, send)
                task_status.started(results.address)  # where the groups are sent (the real port of a tcp :0)
                await self._train(receive, ctx)
        finally:
            self._thread.close()  # idle here: every update it ran has returned

    async def _receive(self, results: Any, send: trio.MemorySendChannel[GroupResult]) -> None:
        async with send:
            async for message in results:
                if isinstance(message, GroupExpected):
                    if self.announced_on_socket:
                        self.expect(message.group_id)
                    else:
                        results.drop("unknown_group", f"announcement of group {message.group_id}")
                    continue
                reason = "unknown_group" if message.group_id not in self._expected else group_problem(message)
                if reason is not None:
                    results.drop(reason, f"group {message.group_id}")
                    continue
                self._expected.discard(message.group_id)
                if (dropped := self._refusal(message)) is not None:
                    await self.reports.send(dropped)  # now, not after the update in progress: frees its pacing room
                    continue
                await send.send(message)

    def _refusal(self, group: GroupResult) -> GroupsConsumed | None:
        if group.cut:
            log.error("learner.cut_group_refused", group_id=group.group_id)
            return GroupsConsumed(cut=True, group_id=group.group_id, reason=drop_reason(group))
        if self.cfg.drop_zero_variance and is_zero_variance(label_rewards(group)):
            return GroupsConsumed(zero_variance=True, group_id=group.group_id, reason=drop_reason(group))
        return None

    async def _train(self, receive: trio.MemoryReceiveChannel[GroupResult], ctx: StageContext) -> None:
        batch: list[GroupResult] = []
        async with receive:
            async for group in receive:
                if self.last_version is not None and self.version >= self.last_version:
                    await self.reports.send(GroupsConsumed(group_id=group.group_id, reason="run_ended"))
                    continue
                batch.append(group)
                if len(batch) < self.cfg.batch_groups:
                    continue
                started = trio.current_time()
                with ctx.profiler.span("learner", "train_step"):
                    weights, stats, state = await self._thread.run(self._update, batch, self.version, ctx.profiler,
                                                                   on_cancel=self.trainer.stop)
                self.version += 1
                await self.reports.send(LearnerReport(
                    version=self.version, stats=stats, train_seconds=trio.current_time() - started, weights=weights,
                    trainer_state=state, groups_trained=len(batch), group_ids=tuple(g.group_id for g in batch),
                ))
                batch = []

    def _on_device(self, profiler: Any) -> contextlib.AbstractContextManager[Any]:
        """On CUDA: the update on the learner's own stream, in a CUDA-event span (the profile's exact GPU time)."""
        device = getattr(self.trainer, "device", None)
        if device is None or device.type != "cuda":
            return contextlib.nullcontext()
        if self._stream is None:
            self._stream = new_stream(device)
        stack = contextlib.ExitStack()
        stack.enter_context(side_stream(device, self._stream))  # first: the span's events go on this stream
        stack.enter_context(profiler.cuda_span("learner", "update"))
        return stack

    def _update(self, batch: list[GroupResult], version: int, profiler: Any) -> tuple[dict[str, Any], dict[str, float], Any]:
        """Runs in the worker thread: its CPU time is attributed to the learner stage."""
        with profiler.bind_thread("learner"), self._on_device(profiler):
            weights, stats = self.trainer.update(batch, version=version)
            stats = {**stats, ZERO_VARIANCE_TRAINED: float(sum(is_zero_variance(label_rewards(g)) for g in batch))}
            state = self.trainer.state_dict() if self.capture_state else None
            if self.cfg.trim_memory:
                memory.trim()  # the update's freed activations back to the OS, from every thread's arena
        return weights, stats, state
