"""The live progress display on stderr: a status line refreshed in place (on a terminal) plus one
permanent line per learner update.

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


def report(phase: str, done: int, total: int, detail: str = "", *, final: bool = False) -> None:
    """Progress of a long phase: `done` of `total` units (epochs, episodes), plus a short `detail`.

    A non-final report refreshes the in-place line on a terminal and shows nothing otherwise; a final
    one prints a permanent line (an epoch finished, an evaluation done). Callable from any thread.
    """
    progress = _CURRENT.get()
    if progress is not None:
        progress.phase_line(phase, done, total, detail, final=final)


def format_phase(phase: str, done: int, total: int, detail: str = "") -> str:
    return f"{phase} {done:>{len(str(total))}}/{total}" + (f" | {detail}" if detail else "")


def _pct(value: Any) -> str:
    return "  -  " if value is None else f"{100 * value:4.0f}%"


def format_status(row: Mapping[str, Any], total_updates: int) -> str:
    """One line per update. Its success rate counts the rollouts of groups that ran to the end: a gate's
    cut groups (mostly failing ones) are not in it, so with cuts it reads above the policy's success."""
    return (
        f"update {row.get('iteration', 0):>3}/{total_updates}"
        f" | uncut success {_pct(row.get('success_rate'))}"
        f" | groups admitted {row.get('groups_admitted', 0):>4} cut {row.get('groups_cut', 0):>3}"
        f" trained {row.get('groups_trained', 0):>4}"
        f" | slots {_pct(row.get('slot_occupancy'))}"
        f" | {row.get('env_steps_per_s', 0.0):6.0f} env steps/s"
        + (f" | loss {row['learner/loss']:+.4f}" if "learner/loss" in row else "")
    )


class Progress:
    def __init__(self, total_updates: int, *, enabled: bool = True, stream: IO[str] | None = None) -> None:
        self.total = total_updates
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.live = enabled and self.stream.isatty()
        self._lock = threading.Lock()
        self._last_live = 0.0

    def activate(self) -> None:
        """Make `report(...)` reach this display in the current context (a Trio run gives each run, and
        each task it starts, its own copy, so this does not leak past `trio.run`)."""
        _CURRENT.set(self)

    def phase_line(self, phase: str, done: int, total: int, detail: str = "", *, final: bool = False) -> None:
        if not self.enabled:
            return
        line = format_phase(phase, done, total, detail)
        with self._lock:
            now = time.monotonic()
            if final:
                self._clear()
                print(line, file=self.stream, flush=True)
            elif self.live and now - self._last_live >= LIVE_PERIOD_S:
                self._last_live = now
                print("\r\x1b[2K" + line, end="", file=self.stream, flush=True)

    def message(self, text: str) -> None:
        if self.enabled:
            self._clear()
            print(text, file=self.stream, flush=True)

    def update_line(self, row: Mapping[str, Any], *, final: bool) -> None:
        if not self.enabled:
            return
        line = format_status(row, self.total)
        if final:
            self._clear()
            print(line, file=self.stream, flush=True)
        elif self.live:
            print("\r\x1b[2K" + line, end="", file=self.stream, flush=True)

    def _clear(self) -> None:
        if self.live:
            print("\r\x1b[2K", end="", file=self.stream)

    async def tick(self, status: Callable[[], Mapping[str, Any]], period_s: float = 0.5) -> None:
        """Refresh the in-place status line until cancelled (terminals only)."""
        if not self.live:
            return
        while True:
            self.update_line(status(), final=False)
            await trio.sleep(period_s)
