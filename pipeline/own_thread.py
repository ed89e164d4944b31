"""One long-lived worker thread of a stage's own, optionally below the event loop's scheduling priority.

`trio.to_thread.run_sync` takes any of Trio's cached worker threads, so a setting made on the thread (its
niceness) would leak to whatever runs there next, and each update may land on a new thread with a malloc
arena of its own. `OwnThread` runs every call on the same thread, made once: the learner's updates run there
(`learner.thread_nice`, issue 60, item 13), so on a machine with fewer cores than busy threads the event
loop's thread, left at the run's priority, takes a core as it wakes instead of queueing behind the update.

A cancelled caller does not abandon the call it started (as `trio.to_thread.run_sync` without
`abandon_on_cancel`): it calls its `on_cancel` (the learner: `Trainer.stop`, so the update ends at its next
micro-batch) and waits, shielded, for the call to return before its `Cancelled` goes on; what the call returned
or raised then is dropped. A call still queued when its caller is cancelled never runs.

`wait_trio` awaits any `concurrent.futures.Future` from Trio (this thread's, or the vLLM backend's asyncio loop's).
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
import trio

log = structlog.get_logger(__name__)

T = TypeVar("T")
MAX_NICE = 19


def lower_thread_priority(nice: int) -> int | None:
    """Add `nice` to the calling thread's niceness (Linux: a thread id is a scheduling entity of its own;
    the rest of the process keeps its priority). Returns the thread's niceness after, or None where nothing
    was changed (nice 0, another OS, or refused)."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return None
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(MAX_NICE, now + nice))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError as exc:  # e.g. a sandbox without setpriority: the thread runs as the process does
        log.warning("thread.nice_refused", nice=nice, error=str(exc))
        return None


async def wait_trio(future: concurrent.futures.Future[T], *, on_cancel: Callable[[], None] | None = None) -> T:
    """Await a concurrent future from Trio, woken through the run's TrioToken (no polling, no blocked Trio thread).
    Cancelling the Trio caller cancels the future; `on_cancel` runs first when the caller is cancelled while the
    future is still pending."""
    try:
        await _done(future)
    finally:
        if not future.done():
            if on_cancel is not None:
                on_cancel()
            future.cancel()
    return future.result()


async def _done(future: concurrent.futures.Future[Any]) -> None:
    """Sleep until `future` is done (its result not read)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: concurrent.futures.Future[Any]) -> None:
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:
            pass  # the Trio run is gone; nobody waits any more

    future.add_done_callback(wake)
    await done.wait()


class OwnThread:
    """A single worker thread made on first use; `close()` joins it."""

    def __init__(self, name: str, *, nice: int = 0) -> None:
        self.name = name
        self.nice = nice
        self.niceness: int | None = None
        """The thread's niceness once it runs (None: left as the process's)."""
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def _start(self) -> None:
        self.niceness = lower_thread_priority(self.nice)

    async def run(self, fn: Callable[..., T], *args: Any, on_cancel: Callable[[], None] | None = None) -> T:
        """`fn(*args)` on the thread; the calling task sleeps until it returns (or raises). A cancelled caller calls
        `on_cancel` (e.g. tells `fn` to stop early) and still waits for `fn` to return, then is cancelled: whatever
        `fn` returned or raised then is dropped."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self.name, initializer=self._start)
        future = self._executor.submit(fn, *args)
        try:
            return await wait_trio(future, on_cancel=on_cancel)
        finally:
            if not future.done():  # cancelled while `fn` runs: it runs to its end (or its stop) all the same
                with trio.CancelScope(shield=True):
                    await _done(future)

    def close(self) -> None:
        """Join the thread (after the call in progress, if any)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
