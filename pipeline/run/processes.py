"""Where the gate and learner stages run: in this process (`transport.mode = "threads"`, the default) or
each in a spawned process of its own (`"processes"`). Either way the same stage code runs; only its
wiring differs, and the sockets are the ones named in `[transport]` (inproc addresses become `ipc://`
files in a private folder across processes; tcp addresses work as they are).

Across processes:

* the learner process builds the trainer from the config and the parent's trainer state (warm start or
  checkpoint), binds the results PULL, and sends `LearnerUpdated` (weights and, for checkpoints, the
  trainer state, packed by `pipeline.tensors`: no pickle) and `LearnerDropped` to the parent's reports
  PULL; the runtime loads the weights into the policy (which forwards them to its decoding workers). The
  runtime announces each training group with `GroupExpected` on the results socket, just before the group.
  The parent takes a `LearnerUpdated` only as the next version (last + 1) and drops anything else it
  cannot have sent (an unknown stage, a second `StageReady`, a weights blob that does not unpack).
* the gate process runs the gate stage (steps PULL, control PUSH) and sends a `GateReport` (statistics and
  checkpoint counters) at most every `REPORT_EVERY_S`; the metrics show the last one. Told to stop (SIGTERM,
  when the phase ends), it settles its shadow labels and sends a final `GateReport`, and the parent keeps
  reading the reports socket until that one arrives (at most `FINAL_REPORT_WAIT_S`): the summary shows it.
* each sends `StageReady` once its sockets are open; the parent waits for it before it admits groups.
* every socket of the phase is sealed with the run's secret (`pipeline.transport`): a child gets it in its
  arguments file (0600, in a 0700 folder, deleted once read; never on its command line) and reports the
  frames its own sockets dropped (`FramesDropped`, at most every `REPORT_EVERY_S`) so that the run's
  `dropped_frames` counts them.
* a child watches its parent and exits when the parent dies; the parent terminates its children when the
  phase ends, on Ctrl-C and on failure (SIGTERM, then SIGKILL after 5 s), and a child that
  exits on its own stops the run with `StageFailed` naming it.

This module is a composition root (it builds stages): the mechanism modules of `pipeline/` do not import it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec
import torch
import trio

from learner.losses import LOSSES
from learner.stage import LearnerStage
from learner.trainer import Trainer
from stages.envs import build_suite
from stages.gate_stage import GateStage
from stages.policy import POLICIES

from pipeline import tensors
from pipeline.config import RunConfig, TransportSection
from pipeline.counters import GroupsConsumed, LearnerReport
from pipeline.messages import (
    FramesDropped,
    GateReport,
    GroupExpected,
    GroupResult,
    LearnerDropped,
    LearnerUpdated,
    ReportStream,
    StageReady,
)
from pipeline.profiling import Profiler
from .runtime import AnnouncedSender
from pipeline.stage import StageContext, StageFailed
from pipeline.transport import Context, open_context

ROOT = Path(__file__).resolve().parents[2]
REPORT_EVERY_S = 0.5
FINAL_REPORT_WAIT_S = 5.0
"""How long the parent reads for the gate's final report once the phase ended: `trio.run_process` kills a
child that has not exited 5 s after SIGTERM, so nothing can come later."""
_ADDRESSES = ("steps", "control", "results", "events", "reports")


@contextlib.asynccontextmanager
async def addresses(cfg: RunConfig) -> AsyncIterator[TransportSection]:
    """The phase's addresses: as configured, or (processes mode) inproc ones as ipc files in a private folder."""
    t = cfg.transport
    if t.mode != "processes" or not any(getattr(t, k).startswith("inproc://") for k in _ADDRESSES):
        yield t
        return
    with tempfile.TemporaryDirectory(prefix="rollcut-") as folder:  # mode 0700: only this user reaches the files
        moved = {k: f"ipc://{folder}/{k}" for k in _ADDRESSES if getattr(t, k).startswith("inproc://")}
        yield msgspec.structs.replace(t, **moved)


def _to_bytes(state: Mapping[str, Any] | None) -> bytes:
    return b"" if state is None else tensors.pack(dict(state))


def _from_bytes(blob: bytes) -> Any:
    """A packed tree, or None (empty). Raises `tensors.WireError`: nothing here runs what a frame names."""
    return tensors.unpack(blob) if blob else None


class RemoteGate:
    """The gate stage of another process as the runtime reads it: its last `GateReport`."""

    def __init__(self) -> None:
        self.name, self.shadow = "", False
        self._statistics: dict[str, float | None] = {}
        self._counters: dict[str, Any] | None = None

    def statistics(self) -> Mapping[str, float | None]:
        return MappingProxyType(self._statistics)  # read-only: the record of one report

    def counters_state(self) -> dict[str, Any] | None:
        return self._counters

    def finish(self) -> None:
        """Pending shadow labels are settled in the gate's process (nothing to do here)."""


class Stages:
    """The gate and learner stages of one phase, and how the runtime talks to them."""

    def __init__(self, cfg: RunConfig, trainer: Trainer, *, capture_state: bool, secret: bytes = b"") -> None:
        """`secret`: the run's secret (`transport.new_secret()`), handed to stage processes as they start."""
        self.cfg = cfg
        self.remote = cfg.transport.mode == "processes"
        self.version = 0
        """The learner's version when the phase starts (a resumed run's last update)."""
        self.gate_counters: Mapping[str, Any] | None = None
        """A resumed run's gate counters (handed to a gate in another process)."""
        self._trainer, self._capture_state, self._secret = trainer, capture_state, secret
        self._learner_version = 0
        """The last version a learner process reported (a report is taken only as the next one)."""
        self._reports_out, self.reports = trio.open_memory_channel[Any](8)
        self._ready: dict[str, trio.Event] = {"gate": trio.Event(), "learner": trio.Event()}
        self._ended: dict[str, trio.Event] = {"gate": trio.Event(), "learner": trio.Event()}
        """Set when a stage's process ended on its own (it cannot report any more)."""
        self.gate: GateStage | RemoteGate | None = None
        if cfg.gate.enabled:
            self.gate = RemoteGate() if self.remote else GateStage(
                gate=cfg.gate.name, k=cfg.gate.k, tau=cfg.gate.tau, checkpoints=cfg.gate.checkpoints,
                shadow=cfg.gate.shadow, options=cfg.gate.options)
        self.learner = None if self.remote else LearnerStage(
            trainer, cfg.learner, reports=self._reports_out, capture_state=capture_state)

    @property
    def local_gate(self) -> GateStage | None:
        """The gate stage when it runs in this process."""
        return self.gate if isinstance(self.gate, GateStage) else None

    def restore_remote_gate(self, counters: Mapping[str, Any] | None) -> None:
        """A resumed run's gate counters, for a gate in another process (it loads them when it starts)."""
        if isinstance(self.gate, RemoteGate) and counters is not None:
            self.gate_counters = self.gate._counters = dict(counters)

    def training_sink(self, channel: trio.MemorySendChannel[Any]) -> Any:
        """Where the group lifecycle sends training groups (each announced to the learner first)."""
        if self.learner is not None:
            return AnnouncedSender(self.learner.expect, channel)
        return _SocketAnnouncer(channel)

    def gate_identity(self) -> tuple[str, bool] | None:
        if self.gate is None:
            return None
        if isinstance(self.gate, GateStage):
            return self.gate.gate.name, self.gate.shadow
        return self.gate.name, self.gate.shadow

    async def run_learner(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        if self.learner is not None:
            self.learner.version = self.version
            await self.learner.run(ctx, task_status=task_status)
            return
        state = self._trainer.state_dict()
        args = (self.cfg, ctx.addresses, str(ctx.run_dir), state, self.version, self._capture_state, os.getpid(),
                self._secret)
        await _supervise("learner", args, self._ready["learner"], self._ended["learner"], task_status=task_status)

    async def run_gate(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        if isinstance(self.gate, GateStage):
            await self.gate.run(ctx, task_status=task_status)
            return
        args = (self.cfg, ctx.addresses, str(ctx.run_dir), self.gate_counters, os.getpid(), self._secret)
        await _supervise("gate", args, self._ready["gate"], self._ended["gate"], task_status=task_status)

    async def receive_reports(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Across processes, own the reports PULL: readiness, gate reports, learner reports into `self.reports`.

        Start it before the stages, in the same nursery: when the phase ends it is cancelled together with the
        gate's supervisor, which sends the gate process SIGTERM; the gate answers with its final statistics,
        so the socket is read on (shielded, at most `FINAL_REPORT_WAIT_S`) until they arrive, then closed.
        (Under a stage's own nursery, a failure of that stage would end this task before the gate was told
        to stop.) In-process there is no socket: the learner sends into `self.reports` itself."""
        if not self.remote:
            task_status.started()
            return
        t = ctx.addresses
        self._learner_version = self.version
        pull = ctx.zmq.socket("pull", t.reports, bind=True, receives=ReportStream, hwm=t.hwm, name="reports")
        async with pull, self._reports_out:
            task_status.started()
            try:
                async for message in pull:
                    await self._take(message, pull, ctx.zmq)
            finally:
                if self._final_gate_report_due():
                    with trio.move_on_after(FINAL_REPORT_WAIT_S, shield=True):
                        await self._read_final_gate_report(pull, ctx.zmq)

    def _final_gate_report_due(self) -> bool:
        """A gate process that reported ready and still runs answers its stop with a final report."""
        return isinstance(self.gate, RemoteGate) and self._ready["gate"].is_set() and not self._ended["gate"].is_set()

    async def _read_final_gate_report(self, pull: Any, zmq: Context) -> None:
        """Read to the gate's final report; a learner's report now comes after the last update: not counted."""
        async for message in pull:
            if isinstance(message, FramesDropped) and message.stage in self._ready:
                zmq.record_remote_drops(message.stage, message.counts)
            elif isinstance(message, GateReport):
                self._take_gate_report(message)
                if message.final:
                    return

    def _take_gate_report(self, message: GateReport) -> None:
        assert isinstance(self.gate, RemoteGate)
        self.gate._statistics, self.gate._counters = message.statistics, message.counters

    async def _take(self, message: ReportStream, pull: Any, zmq: Context) -> None:
        match message:
            case StageReady(stage=stage):
                if stage not in self._ready or self._ready[stage].is_set():
                    pull.drop("unexpected_ready", f"StageReady of {stage!r}")
                    return
                if isinstance(self.gate, RemoteGate) and stage == "gate":
                    self.gate.name, self.gate.shadow = message.gate, message.shadow
                self._ready[stage].set()
            case GateReport() if isinstance(self.gate, RemoteGate):
                self._take_gate_report(message)
            case FramesDropped(stage=stage, counts=counts) if stage in self._ready:
                zmq.record_remote_drops(stage, counts)
            case LearnerDropped(zero_variance=zv, cut=cut):
                await self._reports_out.send(GroupsConsumed(zero_variance=zv, cut=cut))
            case LearnerUpdated():
                report = self._learner_report(message, pull)
                if report is not None:
                    await self._reports_out.send(report)
            case _:
                pull.drop("unexpected_report", type(message).__name__)

    def _learner_report(self, message: LearnerUpdated, pull: Any) -> LearnerReport | None:
        """The report of the next update (last + 1) whose tensors unpack; None (dropped, counted) otherwise."""
        if message.version != self._learner_version + 1:
            pull.drop("version_out_of_order", f"version {message.version} after {self._learner_version}")
            return None
        try:
            weights, state = tensors.unpack_weights(message.weights), _from_bytes(message.trainer_state)
        except tensors.WireError as exc:
            pull.drop("bad_tensors", f"version {message.version}: {exc}")
            return None
        self._learner_version = message.version
        return LearnerReport(version=message.version, stats=message.stats, train_seconds=message.train_seconds,
                             weights=weights, trainer_state=state, groups_trained=message.groups_trained)


class _SocketAnnouncer:
    def __init__(self, channel: trio.MemorySendChannel[Any]) -> None:
        self._channel = channel

    async def send(self, group: GroupResult) -> None:
        await self._channel.send(GroupExpected(group_id=group.group_id))
        await self._channel.send(group)


async def _supervise(name: str, args: tuple[Any, ...], ready: trio.Event, ended: trio.Event, *, task_status: Any) -> None:
    """Run stage `name` in a child process (`python -m pipeline.run.processes`); started once it reported ready.

    Cancelled (the phase ended, Ctrl-C, a failure elsewhere), `trio.run_process` terminates the child
    (SIGTERM, SIGKILL after 5 s) and waits for it; a child that exits on its own sets `ended` (no report
    of it can come any more) and fails the run."""
    with tempfile.TemporaryDirectory(prefix=f"rollcut-{name}-") as folder:  # 0700: the arguments stay private
        path = Path(folder) / "args.pkl"
        _write_private(path, pickle.dumps((sys.path, pickle.dumps(args))))  # the child imports what this process can
        command = [sys.executable, "-m", "pipeline.run.processes", name, str(path)]
        env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_run_child, name, command, env, ended)
            await ready.wait()
            task_status.started()


def _write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read, from the start (it holds the run's secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


async def _run_child(name: str, command: list[str], env: dict[str, str], ended: trio.Event) -> None:
    process = await trio.run_process(command, check=False, env=env)
    ended.set()
    raise StageFailed(name, f"its process exited with code {process.returncode} (its stderr is above)")


# --------------------------------------------------------------------------------------------------
# The children's side


async def _watch_parent(parent: int, cancel: trio.CancelScope) -> None:
    """Polls: the death of another process has no event to wait on here."""
    while os.getppid() == parent:  # noqa: ASYNC110
        await trio.sleep(1.0)
    cancel.cancel()


@contextlib.asynccontextmanager
async def _child(stage: str, addresses: TransportSection, parent: int,
                 secret: bytes) -> AsyncIterator[tuple[Context, Any, trio.Nursery]]:
    """A child's zmq context (sealed with the run's secret), its reports PUSH, and a nursery cancelled when
    the parent dies that also reports the frames this process's sockets drop."""
    async with open_context(addresses.curve_dir, secret=secret) as zmq, trio.open_nursery() as nursery:
        nursery.start_soon(_watch_parent, parent, nursery.cancel_scope)
        reports = zmq.socket("push", addresses.reports, bind=False, hwm=addresses.hwm)
        async with reports:
            nursery.start_soon(_report_drops, stage, zmq, reports)
            yield zmq, reports, nursery
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
            await self._socket.send(LearnerDropped(zero_variance=message.zero_variance, cut=message.cut))
            return
        await self._socket.send(LearnerUpdated(
            version=message.version, stats=dict(message.stats), train_seconds=message.train_seconds,
            groups_trained=message.groups_trained, weights=_to_bytes(message.weights),
            trainer_state=_to_bytes(message.trainer_state)))


async def _serve_learner(cfg: RunConfig, t: TransportSection, run_dir: str, state: Mapping[str, Any], version: int,
                         capture_state: bool, parent: int, secret: bytes) -> None:
    torch.set_num_threads(cfg.learner.torch_threads)
    suite = build_suite(cfg.env.name, cfg.env.options, max_steps=cfg.env.max_steps)  # as the run builds it
    no_warm = msgspec.structs.replace(cfg.pretrain, enabled=False)
    one = msgspec.structs.replace(cfg.policy, workers=1)  # only its trainable model is used here
    model = POLICIES.get(cfg.policy.backend)(one, no_warm, suite, seed=cfg.run.seed).trainable()
    model.load_state_dict(state["model"])  # before the Trainer: its KL reference copies these weights
    trainer = Trainer(model, cfg.learner, LOSSES.get(cfg.learner.loss), temperature=cfg.policy.temperature,
                      top_p=cfg.policy.top_p, seed=cfg.run.seed, total_updates=cfg.run.updates)
    trainer.load_state_dict(dict(state))
    async with _child("learner", t, parent, secret) as (zmq, reports, nursery):
        learner = LearnerStage(trainer, cfg.learner, reports=_WireReports(reports), version=version,
                               capture_state=capture_state, announced_on_socket=True)
        ctx = StageContext(zmq=zmq, addresses=t, run_dir=Path(run_dir), profiler=Profiler(enabled=False))
        await nursery.start(learner.run, ctx)
        await reports.send(StageReady(stage="learner"))
        await trio.sleep_forever()


async def _serve_gate(cfg: RunConfig, t: TransportSection, run_dir: str, counters: Mapping[str, Any] | None,
                     parent: int, secret: bytes) -> None:
    gate = GateStage(gate=cfg.gate.name, k=cfg.gate.k, tau=cfg.gate.tau, checkpoints=cfg.gate.checkpoints,
                     shadow=cfg.gate.shadow, options=cfg.gate.options)
    if counters is not None:
        gate.load_counters(counters)
    async with _child("gate", t, parent, secret) as (zmq, reports, _):
        ctx = StageContext(zmq=zmq, addresses=t, run_dir=Path(run_dir), profiler=Profiler(enabled=False))
        # The parent stops this process with SIGTERM when the phase ends; the statistics since the last
        # periodic report (all of them, in a phase shorter than REPORT_EVERY_S) would die with it.
        with trio.open_signal_receiver(signal.SIGTERM) as stop_requests:  # before ready: every stop is answered
            async with trio.open_nursery() as serving:
                await serving.start(gate.run, ctx)
                await reports.send(StageReady(stage="gate", gate=gate.gate.name, shadow=gate.shadow))
                serving.start_soon(_report_changes, gate, reports)
                async for _ in stop_requests:
                    break
                serving.cancel_scope.cancel()  # the step stream ends here, as the in-process gate's does
        gate.finish()  # settle pending shadow labels, as `run_grpo` does for a gate in its process
        await _send_drops("gate", zmq, reports, {})  # before the final report: the parent reads to that one
        await reports.send(GateReport(statistics=dict(gate.statistics()), counters=gate.counters_state(), final=True))
        # leaving `_child` closes the socket with its linger and ctx.term() flushes this last frame


async def _report_changes(gate: GateStage, reports: Any) -> None:
    """A `GateReport` at most every REPORT_EVERY_S, when the statistics changed (the metrics rows read it)."""
    last: dict[str, Any] = {}
    while True:
        await trio.sleep(REPORT_EVERY_S)
        stats = dict(gate.statistics())
        if stats != last:
            await reports.send(GateReport(statistics=stats, counters=gate.counters_state()))
            last = stats


_SERVE = {"learner": _serve_learner, "gate": _serve_gate}


def main() -> None:
    """`python -m pipeline.run.processes STAGE ARGS_FILE`: started by `_supervise`, not by hand."""
    from pipeline.rundir import configure_logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    stage, path = sys.argv[1], Path(sys.argv[2])
    sys_path, blob = pickle.loads(path.read_bytes())  # written by the parent into its private folder: no socket
    path.unlink()  # it holds the run's secret
    sys.path[:] = [*sys_path, *(p for p in sys.path if p not in sys_path)]  # plugins named `module:Class` import here too
    args = pickle.loads(blob)
    configure_logging(None)
    trio.run(_SERVE[stage], *args)


if __name__ == "__main__":
    main()
