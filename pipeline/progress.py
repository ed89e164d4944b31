"""The live progress display on stderr: a status line refreshed in place (on a terminal) plus one
permanent line per learner update. Off a terminal (a log file, nohup, a batch job) the line that would have been
refreshed is printed as a permanent line at most every `LOG_PERIOD_S`, so a log of a slow run (a held-out
evaluation of a real LM, minutes between updates) still says where it is.

Long phases outside the GRPO loop (the warm start, held-out evaluations) call `report(...)`, which
reaches the `Progress` activated for the current Trio run (`Progress.activate()`; worker threads started
with `trio.to_thread.run_sync` inherit it) and does nothing when there is none, so backends and
evaluators need no handle to it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import IO, Any

import trio

_CURRENT: ContextVar[Progress | None] = ContextVar("rollcut_progress", default=None)
LIVE_PERIOD_S = 0.2
"""Least time between two in-place refreshes of a phase line."""
LOG_PERIOD_S = 60.0
"""Off a terminal: least time between two permanent lines, the first one this long after the display started."""


def report(phase: str, done: int, total: int, detail: str = "", *, final: bool = False) -> None:
    """Progress of a long phase: `done` of `total` units (epochs, episodes), plus a short `detail`.

    A non-final report refreshes the in-place line on a terminal, and off one prints it as a permanent line if
    `LOG_PERIOD_S` passed since the last line; a final one prints a permanent line (an epoch finished, an
    evaluation done). Callable from any thread.
    """
    progress = _CURRENT.get()
    if progress is not None:
        progress.phase_line(phase, done, total, detail, final=final)


def format_phase(phase: str, done: int, total: int, detail: str = "") -> str:
    return f"{phase} {done:>{len(str(total))}}/{total}" + (f" | {detail}" if detail else "")


def _pct(value: Any) -> str:
    return "  -  " if value is None else f"{100 * value:4.0f}%"


def format_status(row: Mapping[str, Any], total_updates: int, *, running: bool = False) -> str:
    """One line per update (`running`: the state between two updates, "after update N"). Its success rate counts
    the rollouts of groups that ran to the end: a gate's cut groups (mostly failing ones) are not in it, so with
    cuts it reads above the policy's success."""
    return (
        ("after " if running else "")
        + f"update {row.get('iteration', 0):>3}/{total_updates}"
        f" | uncut success {_pct(row.get('success_rate'))}"
        f" | groups admitted {row.get('groups_admitted', 0):>4} cut {row.get('groups_cut', 0):>3}"
        f" trained {row.get('groups_trained', 0):>4}"
        f" | slots {_pct(row.get('slot_occupancy'))}"
        f" | {row.get('env_steps_per_s', 0.0):6.0f} env steps/s"
        + (f" | loss {row['learner/loss']:+.4f}" if "learner/loss" in row else "")
    )


class Progress:
    def __init__(self, total_updates: int, *, enabled: bool = True, stream: IO[str] | None = None,
                 log_period_s: float = LOG_PERIOD_S) -> None:
        self.total = total_updates
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.live = enabled and self.stream.isatty()
        self.log_period_s = log_period_s
        self._lock = threading.Lock()
        self._last_live = 0.0
        self._last_line = time.monotonic()

    def activate(self) -> None:
        """Make `report(...)` reach this display in the current context (a Trio run gives each run, and
        each task it starts, its own copy, so this does not leak past `trio.run`)."""
        _CURRENT.set(self)

    def phase_line(self, phase: str, done: int, total: int, detail: str = "", *, final: bool = False) -> None:
        if not self.enabled:
            return
        self._show(format_phase(phase, done, total, detail), final=final)

    def message(self, text: str) -> None:
        if self.enabled:
            self._show(text, final=True)

    def update_line(self, row: Mapping[str, Any], *, final: bool) -> None:
        if self.enabled:
            self._show(format_status(row, self.total, running=not final and not self.live), final=final)

    def _show(self, line: str, *, final: bool) -> None:
        """A permanent line (`final`), or the in-place one: refreshed on a terminal, every `log_period_s` off one."""
        with self._lock:
            now = time.monotonic()
            if final or (not self.live and now - self._last_line >= self.log_period_s):
                self._last_line = now
                print(("\r\x1b[2K" if self.live else "") + line, file=self.stream, flush=True)
            elif self.live and now - self._last_live >= LIVE_PERIOD_S:
                self._last_live = now
                print("\r\x1b[2K" + line, end="", file=self.stream, flush=True)

    async def tick(self, status: Callable[[], Mapping[str, Any]], period_s: float = 0.5) -> None:
        """Show the status line until cancelled: refreshed in place every `period_s` on a terminal, a permanent
        line every `log_period_s` off one."""
        if not self.enabled:
            return
        while True:
            self.update_line(status(), final=False)
            await trio.sleep(period_s if self.live else self.log_period_s / 4)
