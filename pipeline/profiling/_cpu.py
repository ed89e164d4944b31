"""CPU clocks: whole-process CPU (all threads) and another thread's CPU, plus the periodic CPU sampler.

The sampler is a Trio task: every `1/hz` seconds it records the process CPU utilization over the last
period (a counter track in the trace) and reads the CPU clock of every thread still bound to a stage, so a
binding that is never closed still gets its CPU counted at `finish()`, and of every other process bound to
a stage, so one that exits before `finish()` (a decoding worker stopped with its phase) keeps what it used.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from ._recorder import Recorder

Clock = Callable[[], float]

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds() -> float:
    """User + system CPU seconds of this process, all threads included (ns resolution, unlike os.times)."""
    return time.process_time()


def thread_cpu_seconds(native_id: int) -> float | None:
    """CPU seconds of one thread of this process, read from /proc (Linux); None when it cannot be read.

    Prefers `schedstat` (nanoseconds on CPU, the same clock as `time.thread_time`) and falls back to
    `stat` (utime + stime, whole clock ticks). Used only for threads other than the caller; a thread reads
    its own clock with `time.thread_time()`.
    """
    task = f"/proc/self/task/{native_id}"
    try:
        return int(Path(task, "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        stat = Path(task, "stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may contain spaces; the fields after its closing parenthesis are fixed.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime


def other_process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of another process (all its threads), from /proc; None if unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime


@dataclass(slots=True)
class BoundProcess:
    """Another process whose CPU counts for `stage`: its CPU seconds at bind and at the latest reading."""

    stage: str
    pid: int
    cpu_at_bind: float
    cpu_latest: float


class CpuSampler:
    """Samples process CPU utilization and refreshes the CPU reading of bound threads."""

    def __init__(self, recorder: Recorder, hz: float, clock: Clock) -> None:
        self.recorder = recorder
        self.period = 1.0 / hz
        self.clock = clock
        self.samples: list[tuple[float, float, float]] = []  # (t0, t1, process cores busy)
        self.thread_cpu: dict[int, tuple[float, float]] = {}  # native id -> (t, cpu s), latest reading
        self.processes: list[BoundProcess] = []  # other processes working for a stage

    def tick(self, prev: tuple[float, float]) -> tuple[float, float]:
        """Take one reading; `prev` and the result are (wall t, process cpu s)."""
        now = (self.clock(), process_cpu_seconds())
        if now[0] > prev[0]:
            self.samples.append((prev[0], now[0], (now[1] - prev[1]) / (now[0] - prev[0])))
        for buf in self.recorder.buffers():
            if any(b.t1 is None for b in buf.bindings):
                cpu = thread_cpu_seconds(buf.native_id)
                if cpu is not None:
                    self.thread_cpu[buf.native_id] = (now[0], cpu)
        self.refresh_processes()
        return now

    def bind_process(self, stage: str, pid: int) -> None:
        """Count another process's CPU from now on for `stage` (skipped if it cannot be read)."""
        cpu = other_process_cpu_seconds(pid)
        if cpu is not None:
            self.processes.append(BoundProcess(stage, pid, cpu_at_bind=cpu, cpu_latest=cpu))

    def refresh_processes(self) -> None:
        """Read the CPU of every bound process still running (an exited one keeps its last reading)."""
        for bound in self.processes:
            cpu = other_process_cpu_seconds(bound.pid)
            if cpu is not None:
                bound.cpu_latest = cpu

    def process_cpu_by_stage(self) -> dict[str, float]:
        """CPU seconds each stage's bound processes used since they were bound, read now."""
        self.refresh_processes()
        by_stage: dict[str, float] = {}
        for bound in self.processes:
            by_stage[bound.stage] = by_stage.get(bound.stage, 0.0) + bound.cpu_latest - bound.cpu_at_bind
        return by_stage

    async def run(self) -> None:
        """Sample until cancelled (the profiler's sampling nursery cancels it)."""
        prev = (self.clock(), process_cpu_seconds())
        while True:
            await trio.sleep(self.period)
            prev = self.tick(prev)
