"""Nothing the run starts outlives it, however it ends: a policy still being built when Ctrl-C comes (a vLLM
engine takes tens of seconds to start, in processes of its own) is closed once it exists, and a second Ctrl-C
kills what this process started instead of orphaning it.

* `build_in_thread(build, close)`: `build()` in a thread of its own. Cancelled (Ctrl-C during the build), the
  caller stops waiting at once; the thread finishes the build, then closes what it built (`close`), and
  `wait_for_builds()` (run.py, before the process exits) waits for that.
* `kill_descendants()`: SIGKILL every process this one started, and theirs (the second Ctrl-C, which must
  exit at once: an engine's processes would otherwise be orphaned).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import structlog
import trio

log = structlog.get_logger(__name__)

T = TypeVar("T")
_builds: set[threading.Thread] = set()
"""Threads of abandoned builds (and closes) that have not finished closing what they built."""
_builds_lock = threading.Lock()


def _close_quietly(close: Callable[[Any], None], value: Any) -> None:
    try:
        close(value)
    except Exception as exc:  # closing what nobody will use: say so, do not raise into a dying run
        log.warning("teardown.close_failed", error=f"{type(exc).__name__}: {exc}")


def _closing(close: Callable[[Any], None], value: Any) -> None:
    """Close `value` in a tracked thread of its own (the caller is being cancelled: it cannot wait)."""

    def run() -> None:
        try:
            _close_quietly(close, value)
        finally:
            with _builds_lock:
                _builds.discard(thread)

    thread = threading.Thread(target=run, name="rollcut-close", daemon=True)
    with _builds_lock:
        _builds.add(thread)
    thread.start()


async def build_in_thread(build: Callable[[], T], close: Callable[[T], None]) -> T:
    """`build()` run in a thread of its own; its result, or its exception. If the caller is cancelled first,
    the result is closed with `close` as soon as the build returns (in that thread), never left running."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    lock = threading.Lock()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome: tuple[str, Any] = ("value", build())
        except BaseException as exc:  # handed to the caller, which raises it
            outcome = ("error", exc)
        with lock:
            box["outcome"] = outcome
            abandoned = box.get("abandoned", False)
        if not abandoned:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)
            return
        try:
            if outcome[0] == "value":
                _close_quietly(close, outcome[1])
        finally:
            with _builds_lock:
                _builds.discard(thread)

    thread = threading.Thread(target=run, name="rollcut-build", daemon=True)
    thread.start()
    received = False
    try:
        await done.wait()
        received = True
    finally:
        if not received:  # cancelled (or interrupted): whatever the build gives is closed, now or when it returns
            with lock:
                box["abandoned"] = True
                outcome = box.get("outcome")
                if outcome is None:  # still building: the thread closes it, `wait_for_builds` waits for that
                    with _builds_lock:
                        _builds.add(thread)
            if outcome is not None and outcome[0] == "value":
                _closing(close, outcome[1])
    kind, value = box["outcome"]
    if kind == "error":
        raise value
    return value


def pending_builds() -> int:
    """Build / close threads still running."""
    with _builds_lock:
        return len(_builds)


def wait_for_builds(timeout_s: float) -> bool:
    """Wait (blocking) until every abandoned build has finished and closed what it built; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        with _builds_lock:
            threads = list(_builds)
        if not threads:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        threads[0].join(left)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs...), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_descendants() -> list[int]:
    """SIGKILL every process below this one (the whole tree, found first, then killed); returns their pids."""
    pids = descendants(os.getpid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids
