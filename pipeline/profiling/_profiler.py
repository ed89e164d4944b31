"""`Profiler`: the one object a pipeline holds to record per-stage spans, counters and samples."""

from __future__ import annotations

import threading
import time
import timeit
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import msgspec
import structlog
import trio

from ._attribution import attribute_thread_cpu, sample_average
from ._cpu import CpuSampler, process_cpu_seconds, thread_cpu_seconds
from ._gpu import CudaSpan, GpuSampler, cuda_available, cuda_seconds, cuda_times, stage_gpu_seconds
from ._plot import write_plot
from ._recorder import (
    BUSY,
    NULL_SPAN,
    Binding,
    Clock,
    NullSpan,
    Recorder,
    Snapshot,
    Span,
    SpanRecord,
    ThreadBuffer,
    WallSpan,
    span_classes,
)
from ._report import TABLE_FILE, Report, build_report
from ._trace import build_trace

log = structlog.get_logger(__name__)
_NAN = float("nan")

TRACE_FILE = "profile.json"
PLOT_FILE = "profile.png"


class _ProfileConfig(Protocol):
    enabled: bool
    gpu_sample_hz: float


class Profiler:
    """Per-stage profiling: busy/wait spans, thread CPU, NVML GPU samples, counters; trace + table output.

    Args:
        enabled: False makes every method a cheap no-op (spans are a shared null context manager).
        gpu_sample_hz: NVML polling rate inside `sampling()`; 0 turns GPU sampling off.
        clock: the wall clock every timestamp uses (seconds, monotonic).
        cpu_sample_hz: process-CPU counter rate inside `sampling()`.
        thread_cpu: read the thread CPU clock at span boundaries to attribute CPU to stages. It costs one
            `clock_gettime` system call per boundary; off, spans read only `clock` and CPU per stage comes
            from bound threads alone.
        gpu_stages: stages that may use the GPU; GPU utilization is attributed only among these (plus any
            stage that opened a `cuda_span`). None: every stage with busy spans is eligible.
        max_spans_per_thread: spans beyond this per thread are counted as dropped, not stored
            (about 200 bytes each).
        nvml: a pynvml-compatible module (tests); None imports `pynvml`.
        thread_clock: the per-thread CPU clock (tests); None uses `time.thread_time`.

    The profiled window runs from construction to `finish()`.
    """

    def __init__(
        self,
        enabled: bool = True,
        gpu_sample_hz: float = 20.0,
        clock: Clock = time.perf_counter,
        *,
        cpu_sample_hz: float = 10.0,
        thread_cpu: bool = True,
        gpu_stages: Iterable[str] | None = None,
        max_spans_per_thread: int = 2_000_000,
        nvml: ModuleType | None = None,
        thread_clock: Clock | None = None,
    ) -> None:
        self.enabled = enabled
        self._clock = clock
        self._thread_cpu = thread_cpu
        self._cpu_clock = thread_clock if thread_clock is not None else time.thread_time
        self._rec = Recorder(clock, self._cpu_clock, max_spans_per_thread)
        self._rec.recording = self._recording = enabled
        self._local = self._rec._local
        busy, self._wall_span, self._wait_span = span_classes(clock, self._cpu_clock)
        self._span = busy if thread_cpu else self._wall_span
        self._max = max_spans_per_thread
        self._gpu_stages = set(gpu_stages) if gpu_stages is not None else set()
        self._cuda: bool | None = None
        self._cpu = CpuSampler(self._rec, cpu_sample_hz, clock)
        self._gpu = GpuSampler(gpu_sample_hz, clock, nvml)
        self._t_start = clock()
        self._cpu_start = process_cpu_seconds()
        self._t_end: float | None = None
        self._snap: Snapshot | None = None
        self._report: Report | None = None

    @classmethod
    def from_config(cls, cfg: _ProfileConfig, **kwargs: Any) -> Profiler:
        """From the `[profile]` config section (anything with `enabled` and `gpu_sample_hz`)."""
        return cls(enabled=cfg.enabled, gpu_sample_hz=cfg.gpu_sample_hz, **kwargs)

    # ---- recording (hot path) -------------------------------------------------------------------------

    def _spans_list(self) -> list[SpanRecord] | None:
        """This thread's span list, or None (recording off, or the per-thread cap reached)."""
        if not self._recording:
            return None
        try:
            buf = self._local.buf
        except AttributeError:
            buf = self._rec.buffer()
        if len(buf.spans) >= self._max:
            buf.dropped += 1
            return None
        return buf.spans

    def span(self, stage: str, name: str = "") -> Span | WallSpan | NullSpan:
        """Context manager marking `stage` busy (sub-phase `name`). Thread-safe; may contain awaits."""
        # `_spans_list` inlined: this is the hot path.
        if not self._recording:
            return NULL_SPAN
        try:
            spans = self._local.buf.spans
        except AttributeError:
            spans = self._rec.buffer().spans
        if len(spans) < self._max:
            return self._span(spans, stage, name)
        self._local.buf.dropped += 1
        return NULL_SPAN

    def remote_span(self, stage: str, name: str = "") -> WallSpan | NullSpan:
        """Context manager marking `stage` busy while its work runs elsewhere (another process): the span
        counts for the stage's busy % but takes none of the calling thread's CPU, which belongs to the stages
        that thread runs. Pair it with `bind_process` for that work's CPU."""
        spans = self._spans_list()
        return NULL_SPAN if spans is None else self._wall_span(spans, stage, name)

    def wait(self, stage: str, name: str = "") -> WallSpan | NullSpan:
        """Context manager marking `stage` idle-waiting (e.g. on a channel); shown in the trace, not busy."""
        spans = self._spans_list()
        return NULL_SPAN if spans is None else self._wait_span(spans, stage, name)

    def record(self, stage: str, name: str, t0: float, t1: float) -> None:
        """A busy span of `stage` already over, `t0`..`t1` on this profiler's clock (`clock`), taking none of the
        thread's CPU: what an observer saw rather than work the stage did (the loop watch's slow steps)."""
        spans = self._spans_list()
        if spans is not None:
            spans.append((stage, name, BUSY, t0, t1, _NAN, _NAN))

    @property
    def clock(self) -> Clock:
        """The wall clock spans are timed on."""
        return self._clock

    def gauge(self, name: str, value: float) -> None:
        """One sample of a counter track (queue depth, in-flight groups, busy slots)."""
        if self._recording:
            try:
                buf = self._local.buf
            except AttributeError:
                buf = self._rec.buffer()
            buf.gauges.append((name, self._clock(), value))

    def items(self, stage: str, n: int = 1) -> None:
        """Count `n` items processed by `stage` (for items/s)."""
        if self._recording:
            try:
                counts = self._local.buf.items
            except AttributeError:
                counts = self._rec.buffer().items
            counts[stage] = counts.get(stage, 0) + n

    def latency(self, stage: str, name: str, seconds: float) -> None:
        """One latency sample; a stage with samples gets p50/p99 from them instead of span durations."""
        if self._recording:
            try:
                buf = self._local.buf
            except AttributeError:
                buf = self._rec.buffer()
            buf.latencies.append((stage, name, seconds))

    def bind_thread(self, stage: str) -> Binding | NullSpan:
        """Attribute the calling thread's CPU time to `stage` from now on (call it from that thread).

        Use it bare in a dedicated thread (`prof.bind_thread("learner")` at the top of the learner loop),
        or as `with prof.bind_thread("policy"): ...` around work handed to a pooled worker thread. While a
        thread is bound, its CPU goes to the bound stage even inside spans of other stages.
        """
        if not self._recording:
            return NULL_SPAN
        binding = Binding(stage, self._clock, self._cpu_clock)
        self._rec.buffer().bindings.append(binding)
        return binding

    def bind_process(self, stage: str, pid: int) -> None:
        """Attribute another process's CPU time (e.g. an inference engine's) to `stage` until `finish()`.

        Its CPU also counts in the run's process CPU, so it never shows up as negative unattributed time.
        A process that exits before `finish()` keeps the CPU last read for it (at bind, by the sampler, or
        by `finish`).
        """
        if self._recording:
            self._cpu.bind_process(stage, pid)

    def cuda_span(self, stage: str, name: str = "") -> CudaSpan | Span | WallSpan | NullSpan:
        """A busy span that also times the enclosed CUDA work with CUDA events (when torch sees a GPU).

        Without CUDA it is exactly `span(stage, name)`. Either way `stage` becomes a GPU stage for
        utilization attribution. Event times are read at `finish()`, which waits for them.
        """
        self._gpu_stages.add(stage)
        span = self.span(stage, name)
        if span is NULL_SPAN:
            return span
        if self._cuda is None:
            self._cuda = cuda_available()
        return CudaSpan(self._rec, stage, name, span) if self._cuda else span

    # ---- sampling ----------------------------------------------------------------------------------------

    @asynccontextmanager
    async def sampling(self) -> AsyncIterator[None]:
        """Run the CPU and GPU samplers as tasks of an inner nursery until the block exits."""
        if not self._recording:
            yield
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cpu.run)
            await nursery.start(self._gpu.run)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel("profiler sampling window closed")

    @property
    def gpu_status(self) -> str:
        return self._gpu.status

    # ---- results -----------------------------------------------------------------------------------------

    def finish(self) -> Report:
        """Stop recording and compute the per-stage report (idempotent: later calls return the same one)."""
        if self._report is not None:
            return self._report
        self._recording = False
        t_end = self._clock()
        cpu_end = process_cpu_seconds()
        snap = self._rec.snapshot()
        self._t_end, self._snap = t_end, snap
        if not self.enabled:
            self._report = build_report(
                snap,
                window=(self._t_start, t_end),
                cpu_by_stage={},
                process_cpu_s=None,
                gpu_by_stage=None,
                gpu_status="n/a (profiler disabled)",
                gpu_mean_util=[],
                cuda_s={},
            )
            return self._report

        cpu_by_stage: dict[str, float] = {}
        for buf in snap.threads:
            for stage, seconds in self._thread_cpu_by_stage(buf, t_end).items():
                cpu_by_stage[stage] = cpu_by_stage.get(stage, 0.0) + seconds
        other = self._cpu.process_cpu_by_stage()
        for stage, seconds in other.items():
            cpu_by_stage[stage] = cpu_by_stage.get(stage, 0.0) + seconds

        tracks = self._gpu.tracks
        cuda = cuda_times(snap.threads) if any(buf.cuda for buf in snap.threads) else {}
        gpu_by_stage, gpu_rules = stage_gpu_seconds(snap, cuda, tracks, self._gpu_stages)  # (a cuda_span adds its stage)
        self._report = build_report(
            snap,
            window=(self._t_start, t_end),
            cpu_by_stage=cpu_by_stage,
            process_cpu_s=cpu_end - self._cpu_start + sum(other.values()),
            gpu_by_stage=gpu_by_stage,
            gpu_status=self._gpu.status,
            gpu_mean_util=[sample_average(t.util, self._t_start, t_end) for t in tracks],
            cuda_s=cuda_seconds(cuda),
            gpu_rules=gpu_rules,
        )
        return self._report

    def _thread_cpu_by_stage(self, buf: ThreadBuffer, t_end: float) -> dict[str, float]:
        spans = [
            (s, t0, t1, c0, c1) for s, _n, kind, t0, t1, c0, c1 in buf.spans if kind == BUSY and c0 == c0
        ]
        bindings = []
        for b in list(buf.bindings):
            if b.t1 is not None and b.c1 is not None:
                bindings.append((b.stage, b.t0, b.t1, b.c0, b.c1))
            else:
                t1, c1 = self._thread_cpu_now(buf, t_end, spans)
                bindings.append((b.stage, b.t0, max(t1, b.t0), b.c0, max(c1, b.c0)))
        if not spans and not bindings:
            return {}
        return attribute_thread_cpu(spans, bindings)

    def _thread_cpu_now(self, buf: ThreadBuffer, t_end: float, spans: list[Any]) -> tuple[float, float]:
        """(t, cpu) as late as we can read it for a thread whose binding is still open."""
        if buf.ident == threading.get_ident():
            return t_end, self._cpu_clock()
        cpu = thread_cpu_seconds(buf.native_id)
        if cpu is not None:
            return t_end, cpu
        readings = [(t1, c1) for _s, _t0, t1, _c0, c1 in spans]
        if buf.native_id in self._cpu.thread_cpu:
            readings.append(self._cpu.thread_cpu[buf.native_id])
        return max(readings, default=(t_end, 0.0))

    def write(self, run_dir: str | Path, *, plot: bool = True) -> list[Path]:
        """Write profile.json (trace), profile_table.json (rows) and profile.png into `run_dir` (`plot` False: no
        profile.png; `write_plot_from_trace` draws the same picture from profile.json later).

        Calls `finish()` first if needed. A disabled profiler writes nothing and returns [].
        """
        if not self.enabled:
            log.info("profile_not_written", reason="profiler disabled")
            return []
        report = self.finish()
        assert self._snap is not None  # set by finish()
        snap, lo = self._snap, self._t_start
        out = Path(run_dir)
        out.mkdir(parents=True, exist_ok=True)
        stages = snap.stages()
        trace = build_trace(
            (record for record, _i in snap.spans),
            lo=lo,
            stages=stages,
            cpu_samples=self._cpu.samples,
            gpu_tracks=self._gpu.tracks,
            gauges=snap.gauges,
            metadata={"gpu": report.gpu_status, "wall_s": report.wall_s, "table": report.table_markdown()},
        )
        written = [out / TRACE_FILE, out / TABLE_FILE]
        written[0].write_bytes(msgspec.json.encode(trace))
        written[1].write_bytes(report.to_json())
        busy: dict[str, list[tuple[float, float]]] = {s: [] for s in stages}
        waits: dict[str, list[tuple[float, float]]] = {}
        for (stage, _n, kind, t0, t1, _c0, _c1), _i in snap.spans:
            (busy if kind == BUSY else waits).setdefault(stage, []).append((t0, t1))
        if plot and write_plot(
            out / PLOT_FILE,
            lo=lo,
            busy=busy,
            waits=waits,
            cpu_samples=self._cpu.samples,
            gpu_tracks=self._gpu.tracks,
            gauges=snap.gauges,
        ):
            written.append(out / PLOT_FILE)
        return written

    def overhead_estimate(self, calls: int = 20_000) -> dict[str, float]:
        """Measure a span's cost on this thread now, and scale it by the spans recorded so far.

        Returns `span_us` (one enabled span, enter + exit), `null_span_us` (the disabled no-op),
        `spans`, `overhead_s` (spans x the difference) and `overhead_pct` (of the window's wall time; the
        spans of one thread, so compare it with that thread's load).
        """
        probe = Profiler(
            enabled=True,
            gpu_sample_hz=0.0,
            clock=self._clock,
            thread_cpu=self._thread_cpu,
            thread_clock=self._cpu_clock,
        )
        off = Profiler(enabled=False)

        def loop(prof: Profiler) -> None:
            for _ in range(calls):
                with prof.span("probe", "overhead"):
                    pass

        on_s = min(timeit.repeat(lambda: loop(probe), number=1, repeat=3)) / calls
        off_s = min(timeit.repeat(lambda: loop(off), number=1, repeat=3)) / calls
        spans = sum(len(buf.spans) for buf in self._rec.buffers())
        end = self._t_end if self._t_end is not None else self._clock()
        overhead = spans * max(on_s - off_s, 0.0)
        return {
            "span_us": on_s * 1e6,
            "null_span_us": off_s * 1e6,
            "spans": float(spans),
            "overhead_s": overhead,
            "overhead_pct": 100.0 * overhead / max(end - self._t_start, 1e-12),
        }
