"""The request loop of an in-process policy server (torch_tiny, hf): requests queue on a bounded channel, the
loop takes the first one and whatever else arrives within `max_wait_ms` (up to `max_batch`), and hands the
ones whose caller still waits to the backend's batch function. When the loop ends (cancelled, or the batch
function raised) the channel is closed, so a later `act()` fails with `PolicyStopped`, and every request still
queued or in the unfinished batch is released without a result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import trio


class Queued(Protocol):
    done: trio.Event
    """Set once the request has its result, or never will."""
    waiting: bool
    """False once the caller stopped waiting (answered or cancelled)."""


R = TypeVar("R", bound=Queued)


async def collect(recv: trio.MemoryReceiveChannel[R], batch: list[R], *, max_batch: int, max_wait_ms: float) -> None:
    """Append the first request, then whatever arrives within max_wait_ms, up to max_batch."""
    batch.append(await recv.receive())
    with trio.move_on_after(max_wait_ms / 1000):
        while len(batch) < max_batch:
            try:
                batch.append(recv.receive_nowait())
            except trio.WouldBlock:
                batch.append(await recv.receive())


async def serve_batches(
    send: trio.MemorySendChannel[R],
    recv: trio.MemoryReceiveChannel[R],
    run_batch: Callable[[list[R], int], Awaitable[None]],
    *,
    max_batch: int,
    max_wait_ms: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve batches until cancelled: `run_batch(live, abandoned)` gets the requests whose caller still waits
    (possibly none) and how many of the batch were abandoned while queued."""
    batch: list[R] = []
    try:
        task_status.started()
        while True:
            batch = []
            await collect(recv, batch, max_batch=max_batch, max_wait_ms=max_wait_ms)
            live = [r for r in batch if r.waiting]
            await run_batch(live, len(batch) - len(live))
    finally:
        send.close()  # blocked and later act() calls fail with PolicyStopped
        unanswered = batch
        while True:
            try:
                unanswered.append(recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        recv.close()
        for request in unanswered:
            request.done.set()  # no result -> PolicyStopped in act()
