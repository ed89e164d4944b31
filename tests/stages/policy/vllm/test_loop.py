"""The asyncio loop thread and waiting on it from Trio (cancellation reaches the asyncio task)."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
import trio

from stages.policy.vllm._loop import LoopThread, wait_trio


async def _answer(x: int) -> int:
    await asyncio.sleep(0)
    return x * 2


async def test_wait_trio_returns_the_coroutine_result() -> None:
    loop = LoopThread()
    try:
        assert await wait_trio(loop.submit(_answer(21))) == 42
        assert loop.run(_answer(1)) == 2
    finally:
        loop.close()


async def test_cancelling_the_trio_caller_cancels_the_asyncio_task() -> None:
    loop = LoopThread()
    started = trio.Event()
    token = trio.lowlevel.current_trio_token()
    outcome: list[str] = []

    async def forever() -> None:
        token.run_sync_soon(started.set)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    try:
        hooks: list[str] = []
        future = loop.submit(forever())
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_wait, future, hooks)
                await started.wait()
                scope.cancel()
        assert hooks == ["on_cancel"]
        with pytest.raises(concurrent.futures.CancelledError):
            await trio.to_thread.run_sync(future.result)
    finally:
        loop.close()  # gathers every task: the coroutine's own CancelledError handler has run by now
    assert outcome == ["cancelled"]  # the future reports the cancel before the coroutine sees it
    assert not loop.thread.is_alive()


def test_run_from_the_loop_thread_is_refused() -> None:
    loop = LoopThread()
    try:
        async def nested() -> None:
            loop.run(_answer(1))

        with pytest.raises(RuntimeError, match="own thread"):
            loop.run(nested())
    finally:
        loop.close()


async def _wait(future, hooks: list[str]) -> None:  # noqa: ANN001
    await wait_trio(future, on_cancel=lambda: hooks.append("on_cancel"))
