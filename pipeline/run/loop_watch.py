"""Whose time a late tick was (issue 60, item 13): a Trio instrument that times every task step and every
wake-up from the loop's I/O wait, and keeps the ones that held the loop `slow_s` or more.

* A **task step** that ran long (named by its task) kept every other ready task waiting: work done on the loop
  thread that belongs elsewhere, or a step that lost the GIL to another thread halfway.
* A **late wake-up** (`(wake-up)`): the I/O wait returned `slow_s` or more after its deadline. The thread was
  ready to run but was not running: it waited for the GIL (the learner's thread held it) or for a core. A
  zero-timeout poll between ready tasks counts too: each one releases the GIL and must win it back.

`monitor_loop_lag` (pipeline/run/runtime.py) measures the lag; this says where it went. Every slow step or
wake-up is a span of the profile's `loop` stage (the trace's `loop` track, named as above; its row in the profile
table: share of the phase spent in them, p50 / p99), and the phase's summary lists the names that held the loop
longest (`loop_blockers`: count, total and longest ms). The figures live in `PhaseCounters.loop_blocks`, so they
survive a resume with the other counters.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import trio

LOOP_STAGE = "loop"
"""The profile stage the slow steps and wake-ups are spans of."""
WAKE_UP = "(wake-up)"
"""The name of a late wake-up from the I/O wait."""
SLOW_S = 0.002
"""A step or wake-up this long or longer is kept: under half the 5 ms lag goal (issue 60, item 13)."""


class LoopWatch(trio.abc.Instrument):
    """Times task steps and I/O-wait wake-ups; keeps per name (count, total s, longest s) of the slow ones and
    passes each to `record(name, t0, t1)` (the profiler's, when the run profiles). Runs on the loop's thread only:
    Trio calls an instrument's hooks from the thread that runs the loop."""

    def __init__(self, blocks: dict[str, list[float]], slow_s: float = SLOW_S, *,
                 clock: Callable[[], float] = time.perf_counter, record: Callable[[str, float, float], None] | None = None) -> None:
        self.blocks, self.slow_s, self._clock, self._record = blocks, slow_s, clock, record
        """`blocks`: name -> [count, total seconds, longest seconds], added to in place."""
        self._step_t0 = math.inf  # installed mid-step: that step is not timed
        self._deadline = math.inf

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._step_t0 = self._clock()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        t1 = self._clock()
        if t1 - self._step_t0 >= self.slow_s:
            self._add(task.name, self._step_t0, t1)

    def before_io_wait(self, timeout: float) -> None:
        self._deadline = self._clock() + timeout

    def after_io_wait(self, timeout: float) -> None:
        t1 = self._clock()
        if t1 - self._deadline >= self.slow_s:
            self._add(WAKE_UP, self._deadline, t1)

    def _add(self, name: str, t0: float, t1: float) -> None:
        entry = self.blocks.setdefault(name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += t1 - t0
        entry[2] = max(entry[2], t1 - t0)
        if self._record is not None:
            self._record(name, t0, t1)



def blockers(blocks: dict[str, list[float]], top: int = 8) -> list[dict[str, Any]]:
    """The `top` names that held the loop longest in all, longest first."""
    ranked = sorted(blocks.items(), key=lambda item: -item[1][1])[:top]
    return [{"name": name, "count": int(n), "total_ms": round(1e3 * total, 1), "longest_ms": round(1e3 * longest, 1)}
            for name, (n, total, longest) in ranked]


def blockers_table(rows: list[dict[str, Any]], lag_p99_ms: float) -> str:
    """summary.md's table of `blockers`."""
    if not rows:
        return f"Event-loop lag p99 {lag_p99_ms:.1f} ms; no task step or wake-up held the loop {1e3 * SLOW_S:g} ms or more."
    lines = [f"Event-loop lag p99 {lag_p99_ms:.1f} ms. Task steps and wake-ups that held the loop {1e3 * SLOW_S:g} ms or more "
             f"(`{WAKE_UP}`: the loop's thread was ready but waited for the GIL or a core):", "",
             "| held by | times | total ms | longest ms |", "|---|---|---|---|"]
    lines += [f"| `{r['name']}` | {r['count']} | {r['total_ms']:.1f} | {r['longest_ms']:.1f} |" for r in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def watching(watch: LoopWatch) -> Iterator[LoopWatch]:
    """`watch` installed on the running loop within the block."""
    trio.lowlevel.add_instrument(watch)
    try:
        yield watch
    finally:
        trio.lowlevel.remove_instrument(watch)
