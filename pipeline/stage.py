"""The stage contract and the context a stage runs in.

A stage is an object with a `name` and `async run(ctx, *, task_status)`. It opens its own sockets through
`ctx.zmq` at the addresses in `ctx.addresses` (or subscribes to the event stream with `ctx.subscribe()`),
calls `task_status.started()` once it is ready to receive, runs until cancelled, and closes what it
opened (sockets opened with `async with` close themselves; the context's term() flushes them).

Stages are registered in `STAGES` (entry-point group `rollcut.stages`) or named as `module:Class` in
`[[stages]] target = ...`; the class is constructed as `Class(options)` from its strict `Options` Struct
(or as `Class()` when it has none), the plugin convention of `pipeline.plugins`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import structlog
import trio

from .config import TransportSection
from .messages import AnyMessage
from .plugins import build_plugin
from .profiling import Profiler
from .registry import Registry
from .transport import Context, Socket


class StageFailed(RuntimeError):
    """A stage cannot go on (e.g. most of its work fails): the run stops with this one message."""

    def __init__(self, stage: str, message: str) -> None:
        self.stage = stage
        super().__init__(f"stage {stage!r}: {message}")


@dataclass(frozen=True)
class StageContext:
    zmq: Context
    addresses: TransportSection
    run_dir: Path
    profiler: Profiler
    options: Mapping[str, Any] = field(default_factory=dict)
    log: Any = field(default_factory=lambda: structlog.get_logger("rollcut.stage"))

    def subscribe(self, hwm: int | None = None) -> Socket[AnyMessage]:
        """A SUB socket on the pipeline's event stream: every GroupResult, CancelGroup and
        WeightsPublished. Slow subscribers lose messages past the high-water mark (zmq PUB semantics)."""
        return self.zmq.socket(
            "sub", self.addresses.events, bind=False, receives=AnyMessage, hwm=hwm or self.addresses.hwm
        )


@runtime_checkable
class Stage(Protocol):
    name: str

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        ...


STAGES = Registry("stages", {"gate": "stages.gate_plugin:plugin_gate_stage"})


def build_stage(target: str, options: Mapping[str, Any], where: str = "stages.options") -> Stage:
    """`Class(Class.Options(...))` from the `[[stages]]` options table (`Class()` for a stage without
    `Options`), as every plugin is built (`pipeline.plugins`). Raises ValueError listing every bad option."""
    stage = build_plugin(STAGES.get(target), options, where, f"stage {target!r}")
    if not isinstance(stage, Stage):
        raise ValueError(f"stage {target!r} does not have a name and an async run(ctx, *, task_status)")
    return stage
