"""Where the gate and learner stages run, behind one handle each: the phase asks for "the gate" and "the
learner" and never branches on where they are. `place_stages` is the only place that looks at
`transport.mode`: "threads" (the default) runs them in this process, "processes" launches each in a child
of its own (`launch.py`; a Ray actor with `placement.launcher = "ray"`, placed through `PhaseStages.placed`),
running the same stage code (`stage_children.py`), built by `build.py` from the one config.

Across processes:

* the learner child builds its trainer from the config and the parent's trainer state (warm start or
  checkpoint), binds the results PULL, and sends `LearnerUpdated` (weights and, for checkpoints, the trainer
  state, packed by `pipeline.tensors`: no pickle) and `LearnerDropped` to the parent's reports PULL; the
  phase loads the weights into the policy. Each training group is announced with `GroupExpected` on the
  results socket, just before the group. The parent takes a `LearnerUpdated` only as the next version
  (last + 1) and drops anything else it cannot have sent (an unknown stage, a second `StageReady`, a weights
  blob that does not unpack).
* the gate child runs the gate stage (steps PULL, control PUSH) and sends a `GateReport` (statistics and
  checkpoint counters) at most every `REPORT_EVERY_S`. Told to stop (SIGTERM or the actor's `stop()`, when the phase ends), it settles
  its shadow labels and sends a final `GateReport`, and the parent reads the reports socket until that one
  arrives (at most `FINAL_REPORT_WAIT_S`): the summary shows it.
* each says `StageReady` once its sockets are open (`launch.py`'s handshake), with the address it bound (the
  phase connects there: on Ray an ephemeral port of the actor's node); the phase admits groups after.
* every socket is sealed with the run's secret (on Ray: CURVE, each actor with its own key pair); a child reports the frames its own sockets dropped
  (`FramesDropped`, at most every `REPORT_EVERY_S`) so that the run's `dropped_frames` counts them.

The parent's side of the reports socket is `child_reports.py`.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol

import msgspec
import trio

from learner.trainer import Trainer
from pipeline.config import RunConfig, TransportSection
from pipeline.messages import GateReport, GroupExpected, GroupResult, StageReady
from pipeline.sealing import new_secret
from pipeline.stage import StageContext
from stages.rollout import GateIdentity

from . import build
from .child_reports import ChildReports, learner_frame_bytes, to_bytes
from .launch import Child, Launcher, Placed, child_spec, launch
from .runtime import AnnouncedSender

_ADDRESSES = ("steps", "control", "results", "events", "reports")


def custom_stage_name(index: int) -> str:
    """How the phase names the child of `[[stages]]` entry `index` (`process = true`) in reports and failures."""
    return f"custom-{index}"


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


class GateHandle(Protocol):
    """The gate stage as the phase sees it, wherever it runs (`GateStage` in this process, `GateChild`)."""

    async def run(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...

    def identity(self) -> GateIdentity | None:
        """Whose cut decisions the rollout stage accepts (known once the stage is running)."""
        ...

    def statistics(self) -> Mapping[str, float | None]: ...

    def counters_state(self) -> dict[str, Any] | None: ...

    def load_counters(self, state: Mapping[str, Any]) -> None:
        """A resumed run's gate counters (before `run`)."""
        ...

    def finish(self) -> None:
        """The phase ended: settle pending shadow labels."""
        ...


class LearnerHandle(Protocol):
    """The learner stage as the phase sees it, wherever it runs."""

    version: int
    """The version the learner's weights are when the phase starts (a resumed run's last update)."""

    async def run(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...

    def training_sink(self, channel: trio.MemorySendChannel[Any]) -> Any:
        """Where the group lifecycle sends training groups (each announced to the learner first)."""
        ...


@dataclass
class PhaseStages:
    """The gate and learner of one phase, and the learner's reports (`LearnerReport` / `GroupsConsumed`)."""

    gate: GateHandle | None
    learner: LearnerHandle
    reports: trio.MemoryReceiveChannel[Any]
    receive_reports: Any
    """`await nursery.start(receive_reports, ctx)`: reads the children's reports (nothing to read in-process),
    started with the address it bound. Start it before the stages, in the same nursery: cancelled when the
    phase ends together with the gate's launcher, which sends the gate SIGTERM; the gate answers with its final
    statistics, read on (shielded, at most `FINAL_REPORT_WAIT_S`) until they arrive."""
    placed: Callable[[], contextlib.AbstractAsyncContextManager[StagePlacement]]
    """`async with stages.placed() as where`: the stages' hosts exist inside the block (Ray actors), and
    `where` says how the phase's zmq context is keyed and where its sockets bind."""
    custom: list[CustomChild] = field(default_factory=list)
    """The custom stages with `process = true`, each in a child: started once the reports socket is bound,
    before admission, and outliving the training (they read the events to `PhaseFinished`)."""


@dataclass(frozen=True)
class StagePlacement:
    """Where the phase's sockets are, given where its stages run."""

    context_options: dict[str, Any]
    """`open_context` keywords of the phase's context (the run's secret; on Ray, its CURVE keys)."""
    placed: Placed | None
    """The stage actors on Ray (their own key pairs, their nodes); None where the stages need no launcher."""

    def bind(self, t: TransportSection) -> TransportSection:
        """The addresses this process binds: on Ray an ephemeral tcp port each (read back from the socket)."""
        if self.placed is None:
            return t
        return msgspec.structs.replace(t, **{k: self.placed.bind_address(k) for k in ("events", "reports", "control")})

    def reachable(self, bound: str) -> str:
        """The address a peer is given for a socket this process bound at `bound`."""
        return bound if self.placed is None else self.placed.reachable(bound)


@contextlib.asynccontextmanager
async def _here(where: StagePlacement) -> AsyncIterator[StagePlacement]:
    yield where


def place_stages(cfg: RunConfig, trainer: Trainer, *, capture_state: bool, secret: bytes = b"") -> PhaseStages:
    """The phase's gate (None without `[gate]`) and learner, where `transport.mode` puts them (with
    `placement.launcher = "ray"` and processes mode: Ray actors)."""
    reports_in, reports = trio.open_memory_channel[Any](8)
    here = partial(_here, StagePlacement({"secret": secret}, None))
    if cfg.transport.mode != "processes":
        gate = build.gate_stage(cfg) if cfg.gate.enabled else None
        learner = _LocalLearner(build.learner_stage(cfg, trainer, reports_in, version=0, capture_state=capture_state,
                                                    announced_on_socket=False))
        return PhaseStages(gate, learner, reports, _nothing_to_read, here)
    # least privilege: custom stages' children get a secret of their own, which seals only their reports socket
    # (on Ray every actor has a CURVE key pair instead, and no secret is used)
    custom_secret = new_secret() if secret and cfg.placement.launcher != "ray" and any(s.process for s in cfg.stages) else b""
    children = ChildReports(reports_in, custom_secret=custom_secret,
                            **({"max_frame": learner_frame_bytes(trainer.model)} if trainer is not None else {}))
    gate_child = GateChild(cfg, secret) if cfg.gate.enabled else None
    learner_child = LearnerChild(cfg, trainer, secret, children, capture_state=capture_state)
    custom = [CustomChild(cfg, secret, i, children) for i, spec in enumerate(cfg.stages) if spec.process]
    children.gate, children.learner, children.custom = gate_child, learner_child, custom
    placed = here
    if cfg.placement.launcher == "ray":
        placed = partial(_placed_by, build.launcher(cfg), [h for h in (gate_child, learner_child, *custom) if h is not None])
    return PhaseStages(gate_child, learner_child, reports, children.receive, placed, custom)


@contextlib.asynccontextmanager
async def _placed_by(launcher: Launcher, handles: list[GateChild | LearnerChild | CustomChild]) -> AsyncIterator[StagePlacement]:
    """The stage children placed by `launcher` (Ray: an actor each, identified) for the block."""
    async with launcher.place("stage", [h.child for h in handles]) as placed:
        for handle in handles:
            handle.placed = placed
        try:
            yield StagePlacement(placed.context_options(), placed)
        finally:
            for handle in handles:
                handle.placed = None


async def _nothing_to_read(ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started(ctx.addresses.reports)


async def _run_child(child: Child, spec: Any, placed: Placed | None, ctx: StageContext, bound: str | None, *,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Run a stage child until cancelled (or, one that `may_return`, until it returns); started, once it is
    ready, with the address its socket `bound` has as the phase reaches it (a Ray actor binds an ephemeral port
    of its node, keyed by its own pair; None: it binds nothing)."""
    async with trio.open_nursery() as nursery:
        if placed is None:
            await nursery.start(partial(launch, child, spec))
        else:
            await nursery.start(partial(placed.launch, child, placed.sealed(spec)))
        if bound is None:
            task_status.started(None)
            return
        address = child.endpoints.get(bound, getattr(ctx.addresses, bound))
        key = placed.peer_key(child) if placed is not None else None
        if key is not None:
            ctx.zmq.trust_server(address, key)
        task_status.started(address)


class _LocalLearner:
    def __init__(self, stage: Any) -> None:
        self.stage = stage

    @property
    def version(self) -> int:
        return self.stage.version

    @version.setter
    def version(self, value: int) -> None:
        self.stage.version = value

    async def run(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.stage.run(ctx, task_status=task_status)

    def training_sink(self, channel: trio.MemorySendChannel[Any]) -> Any:
        return AnnouncedSender(self.stage.expect, channel)


class GateChild:
    """The gate stage in a child process, as the phase reads it: the last `GateReport` it sent."""

    def __init__(self, cfg: RunConfig, secret: bytes) -> None:
        self._cfg, self._secret = cfg, secret
        self.child = Child("gate", "its process")
        self.placed: Placed | None = None
        self._identity: GateIdentity | None = None
        self._statistics: dict[str, float | None] = {}
        self._counters: dict[str, Any] | None = None

    async def run(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        spec = child_spec("gate", self._cfg, ctx.addresses, self._secret, run_dir=str(ctx.run_dir), gate_counters=self._counters)
        await _run_child(self.child, spec, self.placed, ctx, "steps", task_status=task_status)

    def identity(self) -> GateIdentity | None:
        return self._identity

    def statistics(self) -> Mapping[str, float | None]:
        return MappingProxyType(self._statistics)  # read-only: the record of one report

    def counters_state(self) -> dict[str, Any] | None:
        return self._counters

    def load_counters(self, state: Mapping[str, Any]) -> None:
        self._counters = dict(state)  # handed to the child as it starts

    def finish(self) -> None:
        """Pending shadow labels are settled in the gate's process (nothing to do here)."""

    def took_ready(self, message: StageReady) -> None:
        self._identity = GateIdentity(message.gate, message.shadow)

    def took_report(self, message: GateReport) -> None:
        self._statistics, self._counters = message.statistics, message.counters


class LearnerChild:
    """The learner stage in a child process: it gets the parent trainer's state as it starts."""

    def __init__(self, cfg: RunConfig, trainer: Trainer, secret: bytes, children: ChildReports, *, capture_state: bool) -> None:
        self._cfg, self._trainer, self._secret, self._children = cfg, trainer, secret, children
        self._capture_state = capture_state
        self.child = Child("learner", "its process")
        self.placed: Placed | None = None
        self.version = 0

    async def run(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self._children.learner_version = self.version
        spec = child_spec("learner", self._cfg, ctx.addresses, self._secret, run_dir=str(ctx.run_dir), version=self.version,
                     trainer_state=to_bytes(self._trainer.state_dict()), capture_state=self._capture_state)
        await _run_child(self.child, spec, self.placed, ctx, "results", task_status=task_status)

    def training_sink(self, channel: trio.MemorySendChannel[Any]) -> Any:
        return _SocketAnnouncer(channel)


class CustomChild:
    """A custom stage (`[[stages]]` entry `index`, `process = true`) in a child of its own: `run` returns when the
    child does, once its stage has read the events to `PhaseFinished` (`finished` is then set)."""

    def __init__(self, cfg: RunConfig, secret: bytes, index: int, children: ChildReports) -> None:
        self._cfg, self._secret, self.index, self._children = cfg, secret, index, children
        self.child = Child(custom_stage_name(index), f"its process ({cfg.stages[index].target})", may_return=True)
        self.placed: Placed | None = None
        self.finished = trio.Event()

    async def run(self, ctx: StageContext, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        addresses, secret = ctx.addresses, self._secret
        if self._children.custom_address is not None:  # not the run's secret: its own, and its own reports socket
            addresses = msgspec.structs.replace(addresses, reports=self._children.custom_address)
            secret = self._children.custom_secret
        spec = child_spec("custom", self._cfg, addresses, secret, run_dir=str(ctx.run_dir), index=self.index)
        await _run_child(self.child, spec, self.placed, ctx, None, task_status=task_status)
        self.finished.set()


class _SocketAnnouncer:
    def __init__(self, channel: trio.MemorySendChannel[Any]) -> None:
        self._channel = channel

    async def send(self, group: GroupResult) -> None:
        await self._channel.send(GroupExpected(group_id=group.group_id))
        await self._channel.send(group)
