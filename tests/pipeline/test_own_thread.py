"""A stage's own thread: one thread for every call, its niceness below the loop's, a cancelled caller telling the
call it started to stop and waiting for it, errors raised in the caller."""

import os
import sys
import threading

import pytest
import trio

from pipeline.config import ConfigError, load_config
from pipeline.own_thread import OwnThread, lower_thread_priority

LINUX = sys.platform.startswith("linux")


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


async def test_every_call_runs_on_one_thread_that_is_not_the_loops():
    thread = OwnThread("test-own")
    try:
        idents = [await thread.run(threading.get_ident) for _ in range(5)]
    finally:
        thread.close()
    assert len(set(idents)) == 1 and idents[0] != threading.get_ident()


@pytest.mark.skipif(not LINUX, reason="per-thread niceness is Linux's")
async def test_the_thread_runs_below_the_loops_priority_and_the_loop_does_not():
    loop_before = _niceness()
    thread = OwnThread("test-nice", nice=3)
    try:
        inside = await thread.run(_niceness)
    finally:
        thread.close()
    assert inside == min(19, loop_before + 3) == thread.niceness
    assert _niceness() == loop_before  # the calling thread (and so the rest of the process) kept its priority


def test_nice_zero_changes_nothing():
    before = _niceness()
    assert lower_thread_priority(0) is None and _niceness() == before


async def test_a_cancelled_caller_tells_the_call_to_stop_and_waits_for_it_to_return():
    thread, started, stop, finished = OwnThread("test-cancel"), threading.Event(), threading.Event(), []

    def work() -> str:
        started.set()
        stop.wait()  # released only by the caller's on_cancel: the call stops early when told
        finished.append("stopped")
        raise RuntimeError("stopped part-way")  # dropped: the caller is cancelled, not failed

    got = []
    try:
        async with trio.open_nursery() as nursery:
            async def caller() -> None:
                try:
                    got.append(await thread.run(work, on_cancel=stop.set))
                finally:
                    got.append(list(finished))  # the call had returned before the caller's wait ended

            nursery.start_soon(caller)
            await trio.to_thread.run_sync(started.wait)
            nursery.cancel_scope.cancel()
    finally:
        thread.close()
    assert finished == ["stopped"] and got == [["stopped"]]


async def test_a_call_cancelled_before_it_starts_never_runs():
    thread, started, release, ran = OwnThread("test-queued"), threading.Event(), threading.Event(), []

    def first() -> None:
        started.set()
        release.wait()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(thread.run, first)
            await trio.to_thread.run_sync(started.wait)
            with trio.CancelScope() as scope:
                scope.cancel()  # cancelled as it waits: the second call is still queued behind the first
                await thread.run(lambda: ran.append(True))
            release.set()
    finally:
        thread.close()
    assert ran == []


async def test_an_error_in_the_call_is_raised_in_the_caller_and_the_thread_stays_usable():
    thread = OwnThread("test-error")

    def fail() -> None:
        raise ValueError("update failed")

    try:
        with pytest.raises(ValueError, match="update failed"):
            await thread.run(fail)
        assert await thread.run(lambda: 7) == 7
    finally:
        thread.close()


def test_thread_nice_out_of_range_is_a_config_problem():
    with pytest.raises(ConfigError, match="learner.thread_nice must be in 0..19, got 20"):
        load_config(None, ["learner.thread_nice=20"])
