"""The gate and learner stages in children of their own (roles "gate" and "learner" of `launch.py`, placed by
`placement.py` when `transport.mode = "processes"`: child processes, or Ray actors on `placement.launcher =
"ray"`), and custom stages with `process = true` (role "custom": `serve_custom`).

Each child builds its stage with `build.py` from the config it was given, seals its sockets with the run's
secret (on Ray: CURVE with its own key pair, admitting the coordinator's key), binds its one socket (the
gate's steps, the learner's results; on Ray an ephemeral port of its node), says `StageReady` with that
address on the reports socket once its sockets are open, and reports what the parent reads: the learner its
`LearnerUpdated` / `LearnerDropped`, the gate a `GateReport` at most every `REPORT_EVERY_S` and a final one
when stopped (SIGTERM, or the actor's `stop()`), both the frames their own sockets dropped.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import torch
import trio

from pipeline.counters import GroupsConsumed, LearnerReport
from pipeline.curve import CurveKeys
from pipeline.messages import FramesDropped, GateReport, LearnerDropped, LearnerUpdated, StageReady
from pipeline.profiling import Profiler
from pipeline.stage import StageContext, build_stage
from pipeline.transport import Context, open_context
from stages.gate_stage import GateStage

from . import build
from .child_reports import BOUND_BY, FINAL_REPORT_WAIT_S, REPORT_EVERY_S, from_bytes, to_bytes
from .launch import ChildSpec
from .placement import custom_stage_name

FINAL_REPORT_S = FINAL_REPORT_WAIT_S / 2
"""How long a stopped gate tries to send its final report (the parent reads for it at most FINAL_REPORT_WAIT_S)."""


@contextlib.asynccontextmanager
async def _child_context(stage: str, spec: ChildSpec, keys: CurveKeys | None) -> AsyncIterator[tuple[Context, Any, trio.Nursery, StageContext]]:
    """A child's zmq context (sealed with the run's secret), its reports PUSH, a nursery that also reports the
    frames this process's sockets drop, and the stage context."""
    t = spec.addresses
    if spec.bind_host:  # on Ray: what this child binds, on its node at an ephemeral port (said in StageReady)
        t = msgspec.structs.replace(t, **{name: f"tcp://{spec.bind_host}:0" for name in BOUND_BY.get(stage, ())})
    async with open_context(t.curve_dir, secret=spec.secret, keys=keys) as zmq, trio.open_nursery() as nursery:
        reports = zmq.socket("push", t.reports, bind=False, hwm=t.hwm)
        async with reports:
            nursery.start_soon(_report_drops, stage, zmq, reports)
            ctx = StageContext(zmq=zmq, addresses=t, run_dir=Path(spec.run_dir), profiler=Profiler(enabled=False))
            yield zmq, reports, nursery, ctx
        nursery.cancel_scope.cancel()


async def _report_drops(stage: str, zmq: Context, reports: Any) -> None:
    """A `FramesDropped` at most every REPORT_EVERY_S, when this process's sockets dropped more frames."""
    last: dict[str, dict[str, int]] = {}
    while True:
        await trio.sleep(REPORT_EVERY_S)
        last = await _send_drops(stage, zmq, reports, last)


async def _send_drops(stage: str, zmq: Context, reports: Any, last: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    counts = zmq.dropped_frames()
    if counts != last:
        await reports.send(FramesDropped(stage=stage, counts=counts))
    return counts


class _WireReports:
    """The learner's report sink across processes: each report encoded on the reports socket."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket

    async def send(self, message: LearnerReport | GroupsConsumed) -> None:
        if isinstance(message, GroupsConsumed):
            await self._socket.send(LearnerDropped(zero_variance=message.zero_variance, cut=message.cut,
                                                   group_id=message.group_id, reason=message.reason))
            return
        await self._socket.send(LearnerUpdated(
            version=message.version, stats=dict(message.stats), train_seconds=message.train_seconds,
            groups_trained=message.groups_trained, weights=to_bytes(message.weights),
            trainer_state=to_bytes(message.trainer_state), group_ids=list(message.group_ids)))


async def serve_learner(spec: ChildSpec, keys: CurveKeys | None) -> None:
    cfg = spec.config
    torch.set_num_threads(cfg.learner.torch_threads)
    model = build.backend(cfg, build.suite(cfg), warm_start=False).trainable()  # only its trainable model is used
    trainer = build.trainer(cfg, model, from_bytes(spec.trainer_state))
    async with _child_context("learner", spec, keys) as (_zmq, reports, nursery, ctx):
        learner = build.learner_stage(cfg, trainer, _WireReports(reports), version=spec.version,
                                      capture_state=spec.capture_state, announced_on_socket=True)
        results = await nursery.start(learner.run, ctx)
        await reports.send(StageReady(stage="learner", endpoints={"results": results}))
        await trio.sleep_forever()


async def serve_gate(spec: ChildSpec, keys: CurveKeys | None) -> None:
    gate = build.gate_stage(spec.config, spec.gate_counters)
    async with _child_context("gate", spec, keys) as (zmq, reports, _nursery, ctx):
        # Told to stop (SIGTERM in a child process, `stop()` cancelling a Ray actor's run), the gate settles its
        # shadow labels and sends its final statistics: those since the last periodic report (all of them, in a
        # phase shorter than REPORT_EVERY_S) would die with it.
        try:
            async with trio.open_nursery() as serving:
                if threading.current_thread() is threading.main_thread():  # a child process: SIGTERM stops serving
                    await serving.start(_stop_on_sigterm, serving.cancel_scope)  # before ready: every stop is answered
                steps = await serving.start(gate.run, ctx)
                await reports.send(StageReady(stage="gate", gate=gate.gate.name, shadow=gate.shadow, endpoints={"steps": steps}))
                serving.start_soon(_report_changes, gate, reports)
        finally:  # the step stream has ended here, as the in-process gate's does
            with trio.CancelScope(shield=True), trio.move_on_after(FINAL_REPORT_S):
                gate.finish()  # settle pending shadow labels, as the phase does for a gate in its process
                await _send_drops("gate", zmq, reports, {})  # before the final report: the parent reads to that one
                await reports.send(GateReport(statistics=dict(gate.statistics()), counters=gate.counters_state(), final=True))
        # leaving the context closes the socket with its linger and ctx.term() flushes this last frame


async def serve_custom(spec: ChildSpec, keys: CurveKeys | None) -> None:
    """A `[[stages]]` entry with `process = true` (entry `spec.index`), built here from the config: it subscribes
    to the run's events like any stage, says `StageReady` once started, and this process returns when the stage
    returns (it read `PhaseFinished`): a clean exit is its end (`Child.may_return`). A stage that raises ends
    this process with its traceback on stderr, and the run with one line naming it (`launch.ChildExited`)."""
    entry = spec.config.stages[spec.index]
    stage = build_stage(entry.target, entry.options, f"stages[{spec.index}].options")
    name = custom_stage_name(spec.index)
    async with _child_context(name, spec, keys) as (_zmq, reports, _nursery, ctx), trio.open_nursery() as running:
        await running.start(stage.run, ctx)
        await reports.send(StageReady(stage=name))


async def _stop_on_sigterm(scope: trio.CancelScope, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM) as stop_requests:
        task_status.started()
        async for _ in stop_requests:
            scope.cancel()
            return


async def _report_changes(gate: GateStage, reports: Any) -> None:
    """A `GateReport` at most every REPORT_EVERY_S, when the statistics changed (the metrics rows read it)."""
    last: dict[str, Any] = {}
    while True:
        await trio.sleep(REPORT_EVERY_S)
        stats = dict(gate.statistics())
        if stats != last:
            await reports.send(GateReport(statistics=stats, counters=gate.counters_state()))
            last = stats
