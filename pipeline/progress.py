"""The live progress display on stderr: a status line refreshed in place (on a terminal) plus one
permanent line per learner update."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import IO, Any

import trio


def _pct(value: Any) -> str:
    return "  -  " if value is None else f"{100 * value:4.0f}%"


def format_status(row: Mapping[str, Any], total_updates: int) -> str:
    return (
        f"update {row.get('iteration', 0):>3}/{total_updates}"
        f" | success {_pct(row.get('success_rate'))}"
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
