"""The machine's load while a run's GRPO phase ran: is its wall clock a figure of the pipeline, or of the machine?

`LoadWatch` samples the 1-minute load average (`os.getloadavg`) every few seconds of the phase and, at its
start and end, the CPU time the whole machine spent busy (/proc/stat: user + nice + system + irq + softirq +
steal, over every core) and the CPU time of this run's process tree (this process and every descendant:
decoding workers, stage processes; /proc/<pid>/stat utime + stime, sampled with the load so a child that
exits during the phase still counts what it had used). The difference is what *other* processes took.

Figures (summary.json, summary.md): `load_1m_min` / `_mean` / `_max`, `cores_available` (this process's
CPU affinity), `run_cpu_s`, `other_cpu_s`, `other_cpu_cores` (other_cpu_s / the phase's wall seconds: how
many cores other processes kept busy on average) and `machine_loaded`. A run is *loaded* when its mean load
exceeded the cores available to it **and** other processes took at least a tenth of those cores: a run
whose own threads alone outnumber the cores raises the load too, but that is the pipeline's own cost, the
same in every repeat of it. The A/B report (pipeline/ab/_timing.py) leaves a loaded run's wall clock out of
its wall means and ratios unless told to keep it. Without /proc (not Linux) the CPU figures are None and the
load alone decides.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

OTHER_SHARE = 0.1
"""Share of the available cores other processes must have used (with the load above the cores) to flag a run."""
SAMPLE_S = 5.0
"""Seconds between load samples (the kernel updates the load average every 5 s)."""

_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""/proc/stat cpu columns that are busy time: user, nice, system, (idle, iowait skipped) irq, softirq, steal.
guest and guest_nice are already inside user and nice."""

ProcessKey = tuple[int, int]
"""(pid, start time in clock ticks): a pid the kernel reuses is another process."""


def cores_available() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK"))


def machine_busy_cpu_s(proc: Path = Path("/proc")) -> float | None:
    """CPU seconds every core of the machine has spent busy since boot (None without /proc/stat)."""
    try:
        first = (proc / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:]]
    return sum(values[i] for i in _BUSY_FIELDS if i < len(values)) / _ticks()


def _stat_fields(text: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line after the command name (which may hold spaces and parentheses)."""
    return text[text.rindex(")") + 2 :].split()


@dataclass(frozen=True)
class TreeCpu:
    """CPU seconds of a process tree at one moment."""

    processes: dict[ProcessKey, float]
    """user + system of the root and of each live descendant."""
    children: frozenset[ProcessKey] = frozenset()
    """The root's direct children among them."""
    reaped: float = 0.0
    """The root's cutime + cstime: everything its children that it has waited for ever used."""


def process_tree_cpu(root: int | None = None, proc: Path = Path("/proc")) -> TreeCpu:
    """CPU seconds (user + system) of `root` (this process) and of every process descending from it, now."""
    root = os.getpid() if root is None else root
    parent: dict[int, int] = {}
    usage: dict[int, tuple[int, float]] = {}
    reaped = 0.0
    ticks = _ticks()
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields((entry / "stat").read_text())
        except (OSError, ValueError):
            continue  # it exited meanwhile
        pid = int(entry.name)
        # fields[0] is the state; ppid is field 4 of the line, utime 14, stime 15, cutime 16, cstime 17, starttime 22
        parent[pid] = int(fields[1])
        usage[pid] = (int(fields[19]), (int(fields[11]) + int(fields[12])) / ticks)
        if pid == root:
            reaped = (int(fields[13]) + int(fields[14])) / ticks
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    tree: dict[ProcessKey, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in usage:
            tree[(pid, usage[pid][0])] = usage[pid][1]
        todo += children.get(pid, [])
    direct = frozenset((pid, usage[pid][0]) for pid in children.get(root, []) if pid in usage)
    return TreeCpu(tree, direct, reaped)


def is_loaded(figures: Mapping[str, Any]) -> bool | None:
    """Whether a run's load figures (summary.json) flag it as loaded (None: the run recorded none)."""
    load, cores, other = figures.get("load_1m_mean"), figures.get("cores_available"), figures.get("other_cpu_cores")
    if not isinstance(load, int | float) or not isinstance(cores, int | float):
        return None
    if load <= cores:
        return False
    return other is None or other >= OTHER_SHARE * cores


@dataclass
class LoadWatch:
    """Load samples and CPU counters over one window (the GRPO phase); the sources are injectable for tests."""

    loadavg: Callable[[], float] = lambda: os.getloadavg()[0]
    machine_cpu: Callable[[], float | None] = machine_busy_cpu_s
    tree_cpu: Callable[[], TreeCpu] = process_tree_cpu
    cores: int = field(default_factory=cores_available)
    clock: Callable[[], float] = time.monotonic
    loads: list[float] = field(default_factory=list)
    _started: float = 0.0
    _machine_start: float | None = None
    _first: TreeCpu = field(default_factory=lambda: TreeCpu({}))
    _seen: dict[ProcessKey, float] = field(default_factory=dict)
    """Each process's CPU when last seen in the window."""
    _children: set[ProcessKey] = field(default_factory=set)
    _now: TreeCpu = field(default_factory=lambda: TreeCpu({}))

    def start(self) -> None:
        self._started = self.clock()
        self._machine_start = self.machine_cpu()
        self._first = self._now = self.tree_cpu()
        self._seen = dict(self._first.processes)
        self._children = set(self._first.children)
        self.loads = [self.loadavg()]

    def sample(self) -> None:
        self.loads.append(self.loadavg())
        self._now = self.tree_cpu()
        self._seen |= self._now.processes
        self._children |= self._now.children

    def run_cpu_s(self) -> float:
        """CPU the tree used in the window: each process's use while seen, and for a direct child the root waited
        for, the rest of its use (the root's cutime grew by its whole total)."""
        start = self._first.processes
        seen = sum(cpu - start.get(key, 0.0) for key, cpu in self._seen.items())
        gone = [key for key in self._children if key not in self._now.processes]
        return seen + (self._now.reaped - self._first.reaped) - sum(self._seen[key] for key in gone)

    def figures(self) -> dict[str, Any]:
        """The window's figures, from its start to now (take a last `sample()` first)."""
        wall_s = self.clock() - self._started
        machine_end = self.machine_cpu()
        run_cpu = self.run_cpu_s()
        other = None
        if self._machine_start is not None and machine_end is not None:
            other = max(0.0, machine_end - self._machine_start - run_cpu)
        figures: dict[str, Any] = {
            "load_1m_min": min(self.loads) if self.loads else None,
            "load_1m_mean": sum(self.loads) / len(self.loads) if self.loads else None,
            "load_1m_max": max(self.loads) if self.loads else None,
            "cores_available": self.cores,
            "run_cpu_s": run_cpu,
            "other_cpu_s": other,
            "other_cpu_cores": other / wall_s if other is not None and wall_s > 0 else None,
        }
        return figures | {"machine_loaded": is_loaded(figures)}


@asynccontextmanager
async def watching(watch: LoadWatch | None = None, *, every_s: float = SAMPLE_S) -> AsyncIterator[LoadWatch]:
    """Sample `watch` (a new one by default) every `every_s` seconds while the block runs, once more at its end."""
    watch = watch if watch is not None else LoadWatch()
    watch.start()

    async def sampler() -> None:
        while True:
            await trio.sleep(every_s)
            await trio.to_thread.run_sync(watch.sample)  # a walk over /proc: off the loop

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler)
        try:
            yield watch
        finally:
            nursery.cancel_scope.cancel("load window closed")
    watch.sample()
