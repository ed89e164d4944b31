"""The reports socket of a phase whose stages run in children (`placement.py`, processes mode): what each child
says (`StageReady`, `GateReport`, `FramesDropped`, `LearnerUpdated` / `LearnerDropped`), checked against what it
can have sent, and the learner's turned into the phase's `LearnerReport` / `GroupsConsumed`. A frame a child
cannot have sent (an unknown stage, a second `StageReady`, an update out of order, tensors that do not unpack) is
counted and dropped. Least privilege: a custom stage's child gets neither the run's secret nor this socket; it
reports (`StageReady`, `FramesDropped`, nothing else) on a socket of its own, `custom_reports`, sealed with a
secret only custom children get, so a plugin in its own process cannot forge cuts, training groups or learner
reports. The report protocol's constants and tensor packing live here too: `stage_children.py`
speaks the other side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from pipeline import tensors
from pipeline.counters import GroupsConsumed, LearnerReport
from pipeline.messages import (
    CustomReportStream,
    FramesDropped,
    GateReport,
    LearnerDropped,
    LearnerUpdated,
    ReportStream,
    StageReady,
)
from pipeline.stage import StageContext
from pipeline.transport import MESSAGE_FRAME_BYTES, Context, weights_frame_bytes

if TYPE_CHECKING:
    from .launch import Child
    from .placement import CustomChild, GateChild, LearnerChild

REPORT_EVERY_S = 0.5
FINAL_REPORT_WAIT_S = 5.0
"""How long the parent reads for the gate's final report once the phase ended: `trio.run_process` kills a
child that has not exited 5 s after SIGTERM, so nothing can come later."""
BOUND_BY = {"gate": {"steps"}, "learner": {"results"}}
"""The addresses a stage child binds (and says in its `StageReady`); the phase binds the others (a custom
stage's child binds none)."""


def learner_frame_bytes(model: Any) -> int:
    """The largest `LearnerUpdated` of a learner training `model`: its weights, and a trainer state of the model,
    Adam's two moments, the moving average and the KL reference (with room to spare: 8 copies)."""
    state = model.state_dict()
    return weights_frame_bytes(sum(t.numel() * t.element_size() for t in state.values() if hasattr(t, "numel")), copies=8)


def _beside(address: str, suffix: str) -> str:
    """Another address of the same kind beside `address`: a sibling ipc file / inproc name, or a free tcp port."""
    if address.startswith("tcp://"):
        return f"{address.rsplit(':', 1)[0]}:0"
    return f"{address}-{suffix}"


def to_bytes(state: Mapping[str, Any] | None) -> bytes:
    return b"" if state is None else tensors.pack(dict(state))


def from_bytes(blob: bytes) -> Any:
    """A packed tree, or None (empty). Raises `tensors.WireError`: nothing here runs what a frame names."""
    return tensors.unpack(blob) if blob else None


class ChildReports:
    """The reports PULL of a phase whose stages run in children: readiness, gate reports, learner reports."""

    def __init__(self, reports: trio.MemorySendChannel[Any], *, custom_secret: bytes = b"",
                 max_frame: int = MESSAGE_FRAME_BYTES) -> None:
        self._reports = reports
        self.max_frame = max_frame
        """The largest report frame: a learner's weights and trainer state (`learner_frame_bytes`)."""
        self.custom_secret = custom_secret
        """Seals the custom stages' own reports socket (b"": they report on this one, as on Ray, keyed by CURVE)."""
        self.custom_address: str | None = None
        """Where the custom stages' children report, once `receive` bound it."""
        self.gate: GateChild | None = None
        self.learner: LearnerChild | None = None
        self.custom: list[CustomChild] = []
        self.learner_version = 0
        """The last version the learner reported (a report is taken only as the next one)."""

    def _children(self) -> dict[str, Child]:
        return {h.child.stage: h.child for h in (self.gate, self.learner, *self.custom) if h is not None}

    async def receive(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        t = ctx.addresses
        pull = ctx.zmq.socket("pull", t.reports, bind=True, receives=ReportStream, hwm=t.hwm, name="reports",
                              max_frame=self.max_frame)
        async with pull, self._reports, trio.open_nursery() as nursery:
            if self.custom and self.custom_secret:
                custom = ctx.zmq.socket("pull", _beside(t.reports, "custom"), bind=True, receives=CustomReportStream,
                                        hwm=t.hwm, name="custom_reports", secret=self.custom_secret)
                self.custom_address = custom.address
                nursery.start_soon(self._take_custom, custom, ctx.zmq)
            task_status.started(pull.address)
            try:
                async for message in pull:
                    await self._take(message, pull, ctx.zmq)
            finally:
                if self._final_gate_report_due():
                    with trio.move_on_after(FINAL_REPORT_WAIT_S, shield=True):
                        await self._read_final_gate_report(pull, ctx.zmq)

    async def _take_custom(self, pull: Any, zmq: Context) -> None:
        """The custom stages' reports: each one's `StageReady` (once, binding nothing) and `FramesDropped`."""
        custom = {h.child.stage: h.child for h in self.custom}
        async with pull:
            async for message in pull:
                match message:
                    case StageReady(stage=stage, endpoints=endpoints) if stage in custom and not custom[stage].ready.is_set() \
                            and not endpoints:
                        custom[stage].ready.set()
                    case FramesDropped(stage=stage, counts=counts) if stage in custom:
                        zmq.record_remote_drops(stage, counts)
                    case _:
                        pull.drop("unexpected_report", f"{type(message).__name__} of {getattr(message, 'stage', '?')!r}")

    def _final_gate_report_due(self) -> bool:
        """A gate child that said ready and still runs answers its stop with a final report."""
        return self.gate is not None and self.gate.child.ready.is_set() and not self.gate.child.ended.is_set()

    async def _read_final_gate_report(self, pull: Any, zmq: Context) -> None:
        """Read to the gate's final report; a learner's report now comes after the last update: not counted."""
        assert self.gate is not None
        async for message in pull:
            if isinstance(message, FramesDropped) and message.stage in self._children():
                zmq.record_remote_drops(message.stage, message.counts)
            elif isinstance(message, GateReport):
                self.gate.took_report(message)
                if message.final:
                    return

    async def _take(self, message: ReportStream, pull: Any, zmq: Context) -> None:
        children = self._children()
        match message:
            case StageReady(stage=stage, endpoints=endpoints):
                if stage not in children or children[stage].ready.is_set() or not set(endpoints) <= BOUND_BY.get(stage, set()):
                    pull.drop("unexpected_ready", f"StageReady of {stage!r} ({sorted(endpoints)} bound)")
                    return
                children[stage].endpoints = dict(endpoints)
                if stage == "gate" and self.gate is not None:
                    self.gate.took_ready(message)
                children[stage].ready.set()
            case GateReport() if self.gate is not None:
                self.gate.took_report(message)
            case FramesDropped(stage=stage, counts=counts) if stage in children:
                zmq.record_remote_drops(stage, counts)
            case LearnerDropped(zero_variance=zv, cut=cut, group_id=group_id, reason=reason):
                await self._reports.send(GroupsConsumed(zero_variance=zv, cut=cut, group_id=group_id, reason=reason))
            case LearnerUpdated():
                report = self._learner_report(message, pull)
                if report is not None:
                    await self._reports.send(report)
            case _:
                pull.drop("unexpected_report", type(message).__name__)

    def _learner_report(self, message: LearnerUpdated, pull: Any) -> LearnerReport | None:
        """The report of the next update (last + 1) whose tensors unpack; None (dropped, counted) otherwise."""
        if message.version != self.learner_version + 1:
            pull.drop("version_out_of_order", f"version {message.version} after {self.learner_version}")
            return None
        try:
            weights, state = tensors.unpack_weights(message.weights), from_bytes(message.trainer_state)
        except tensors.WireError as exc:
            pull.drop("bad_tensors", f"version {message.version}: {exc}")
            return None
        self.learner_version = message.version
        return LearnerReport(version=message.version, stats=message.stats, train_seconds=message.train_seconds,
                             weights=weights, trainer_state=state, groups_trained=message.groups_trained,
                             group_ids=tuple(message.group_ids))
