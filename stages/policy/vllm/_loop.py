"""An asyncio event loop in its own thread, and the Trio side of waiting on it.

vLLM's `AsyncLLM` is asyncio code and needs one long-lived loop (a new loop per call hangs it). The loop
runs in a daemon thread for the policy's lifetime; Trio code submits coroutines with `submit` and waits
with `wait_trio` (`pipeline.own_thread`), which wakes the Trio task through its TrioToken (no polling, no
blocked Trio thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from pipeline.own_thread import wait_trio

T = TypeVar("T")
__all__ = ["LoopThread", "wait_trio"]


class LoopThread:
    """Owns one asyncio loop running in a daemon thread until `close()`."""

    def __init__(self, name: str = "rollcut-asyncio") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    @property
    def native_id(self) -> int | None:
        return self.thread.native_id

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop; cancelling the returned future cancels the asyncio task."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and block the calling (non-loop) thread for its result."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("LoopThread.run() called from the loop's own thread")
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and join the thread (idempotent)."""
        if not self.thread.is_alive():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.submit(_cancel_all()).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)
