"""The hot path: per-thread record buffers and the span / wait / binding context managers.

Each thread appends plain tuples to its own buffer (found through `threading.local`), so recording takes
no lock; `Recorder.snapshot` merges the buffers once, at the end. The GIL makes `list.append` atomic, so a
snapshot taken while another thread still records is consistent (the late records are just not in it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BUSY = 0
WAIT = 1

Clock = Callable[[], float]

SpanRecord = tuple[str, str, int, float, float, float, float]
"""(stage, name, kind, wall t0, wall t1, thread cpu t0, thread cpu t1); cpu values are NaN when unmeasured."""

_NAN = float("nan")


class ThreadBuffer:
    """Everything one thread recorded. Only its own thread appends; the snapshot reads."""

    __slots__ = (
        "bindings",
        "cuda",
        "dropped",
        "gauges",
        "ident",
        "items",
        "latencies",
        "name",
        "native_id",
        "spans",
    )

    def __init__(self) -> None:
        thread = threading.current_thread()
        self.ident = thread.ident
        self.native_id = threading.get_native_id()
        self.name = thread.name
        self.spans: list[SpanRecord] = []
        self.gauges: list[tuple[str, float, float]] = []  # (name, t, value)
        self.latencies: list[tuple[str, str, float]] = []  # (stage, name, seconds)
        self.items: dict[str, int] = {}
        self.bindings: list[Binding] = []
        self.cuda: list[tuple[str, str, Any, Any, int, float, float]] = []
        """(stage, name, start event, end event, CUDA device index, wall t0, wall t1) per `cuda_span`."""
        self.dropped = 0


class Span:
    """A busy span: wall clock and thread CPU clock read at enter and exit, one append at exit.

    The clocks are class attributes of a per-profiler subclass (`span_classes`), which keeps the
    constructor to three stores: this object is created once per span, on the hot path.
    """

    __slots__ = ("_c0", "_name", "_spans", "_stage", "_t0")
    _clock: Clock
    _cpu: Clock

    def __init__(self, spans: list[SpanRecord], stage: str, name: str) -> None:
        self._spans = spans
        self._stage = stage
        self._name = name

    def __enter__(self) -> Span:
        self._c0 = self._cpu()
        self._t0 = self._clock()
        return self

    def __exit__(self, *exc_info: object) -> None:
        t1 = self._clock()
        self._spans.append((self._stage, self._name, BUSY, self._t0, t1, self._c0, self._cpu()))


class WallSpan:
    """A span that reads only the wall clock: waits, and busy spans when thread CPU is off."""

    __slots__ = ("_name", "_spans", "_stage", "_t0")
    _clock: Clock
    _kind: int

    def __init__(self, spans: list[SpanRecord], stage: str, name: str) -> None:
        self._spans = spans
        self._stage = stage
        self._name = name

    def __enter__(self) -> WallSpan:
        self._t0 = self._clock()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._spans.append((self._stage, self._name, self._kind, self._t0, self._clock(), _NAN, _NAN))


def span_classes(clock: Clock, cpu: Clock) -> tuple[type[Span], type[WallSpan], type[WallSpan]]:
    """(busy span, wall-only busy span, wait span) classes bound to these clocks."""
    clocks = {"__slots__": (), "_clock": staticmethod(clock)}
    return (
        type("Span", (Span,), {**clocks, "_cpu": staticmethod(cpu)}),
        type("WallSpan", (WallSpan,), {**clocks, "_kind": BUSY}),
        type("WaitSpan", (WallSpan,), {**clocks, "_kind": WAIT}),
    )


class NullSpan:
    """What a disabled or finished profiler hands out: enter and exit do nothing."""

    __slots__ = ()

    def __enter__(self) -> NullSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


NULL_SPAN = NullSpan()


class Binding:
    """A thread bound to a stage from `t0` until `t1` (None: still bound). Also a context manager.

    `prof.bind_thread(stage)` binds at once; used as `with prof.bind_thread(stage): ...` it also unbinds
    at exit, which is what a pooled worker thread (trio.to_thread's cache) wants.
    """

    __slots__ = ("_clock", "_cpu", "c0", "c1", "stage", "t0", "t1")

    def __init__(self, stage: str, clock: Clock, cpu: Clock) -> None:
        self.stage = stage
        self._clock = clock
        self._cpu = cpu
        self.c0 = cpu()
        self.t0 = clock()
        self.t1: float | None = None
        self.c1: float | None = None

    def __enter__(self) -> Binding:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Unbind now (idempotent)."""
        if self.t1 is None:
            self.t1 = self._clock()
            self.c1 = self._cpu()


@dataclass
class Snapshot:
    """All buffers merged, taken when recording stops."""

    threads: list[ThreadBuffer] = field(default_factory=list)
    spans: list[tuple[SpanRecord, int]] = field(default_factory=list)  # (record, thread index)
    gauges: list[tuple[str, float, float]] = field(default_factory=list)
    latencies: list[tuple[str, str, float]] = field(default_factory=list)
    items: dict[str, int] = field(default_factory=dict)
    dropped: int = 0

    def stages(self) -> list[str]:
        """Every stage named anywhere, in order of first appearance in time (spans), then the rest by name."""
        first: dict[str, float] = {}
        for (stage, _n, _k, t0, *_), _i in self.spans:
            if t0 < first.get(stage, float("inf")):
                first[stage] = t0
        ordered = sorted(first, key=first.__getitem__)
        rest = {s for s in self.items} | {s for s, _n, _v in self.latencies}
        rest |= {b.stage for buf in self.threads for b in buf.bindings}
        return ordered + sorted(rest - set(first))


class Recorder:
    """Owns the per-thread buffers. `Profiler` wraps it with the public API."""

    def __init__(self, clock: Clock, cpu_clock: Clock | None, max_spans_per_thread: int) -> None:
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.max_spans = max_spans_per_thread
        self.recording = True
        self._local = threading.local()
        self._lock = threading.Lock()  # only taken when a thread records for the first time
        self._buffers: list[ThreadBuffer] = []

    def buffer(self) -> ThreadBuffer:
        """This thread's buffer, created on first use."""
        try:
            return self._local.buf
        except AttributeError:
            buf = self._local.buf = ThreadBuffer()
            with self._lock:
                self._buffers.append(buf)
            return buf

    def buffers(self) -> list[ThreadBuffer]:
        with self._lock:
            return list(self._buffers)

    def thread_cpu(self) -> Clock:
        return self.cpu_clock if self.cpu_clock is not None else time.thread_time

    def snapshot(self) -> Snapshot:
        """Stop recording and merge every thread's records."""
        self.recording = False
        snap = Snapshot(threads=self.buffers())
        for index, buf in enumerate(snap.threads):
            snap.spans.extend((record, index) for record in list(buf.spans))
            snap.gauges.extend(list(buf.gauges))
            snap.latencies.extend(list(buf.latencies))
            for stage, n in list(buf.items.items()):
                snap.items[stage] = snap.items.get(stage, 0) + n
            snap.dropped += buf.dropped
        snap.gauges.sort(key=lambda g: g[1])
        return snap
