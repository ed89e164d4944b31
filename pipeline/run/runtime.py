"""Small tasks every GRPO phase runs, whatever its stages: the event publisher, the custom stages (the
"observers"), the loop-lag monitor, a nursery host and an event relay. Each owns what it opens."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import trio

from pipeline.counters import PhaseCounters
from pipeline.messages import AnyMessage
from pipeline.stage import Stage, StageContext, StageFailed
from pipeline.transport import Context


async def publish_events(
    zmq: Context, address: str, hwm: int, inbox: trio.MemoryReceiveChannel[AnyMessage], *, task_status: Any
) -> None:
    """Own the events PUB socket (started with the address it bound): forward every message of the phase's
    event channel."""
    pub = zmq.socket("pub", address, bind=True, hwm=hwm)
    async with pub, inbox:
        task_status.started(pub.address)
        async for message in inbox:
            await pub.send(message)


async def run_observers(observers: Sequence[Stage], ctx: StageContext, finished: trio.Event, *, task_status: Any) -> None:
    """Run the custom stages; a stage that raises stops the run with one message naming it."""
    async with trio.open_nursery() as nursery:
        for observer in observers:
            await nursery.start(_run_observer, observer, ctx)
        task_status.started()
    finished.set()


async def _run_observer(observer: Stage, ctx: StageContext, *, task_status: Any) -> None:
    name = getattr(observer, "name", type(observer).__name__)
    try:
        await observer.run(ctx, task_status=task_status)
    except Exception as exc:  # a plugin's bug: one clear line, not an exception-group traceback
        raise StageFailed(name, f"{type(exc).__name__}: {exc}") from exc


@contextlib.contextmanager
def gil_switch_interval(ms: float) -> Iterator[None]:
    """Within the block, a thread holding the GIL is asked to hand it over after `ms` milliseconds when another
    waits (`sys.setswitchinterval`; 0 = Python's own, 5 ms). The Trio thread gives the GIL up at each socket
    wait and each zmq call, and while the learner's thread runs Python code (building its items and packed
    rows) every one of those costs up to the interval before the loop runs on: a tick could wait several
    intervals (`run.gil_switch_ms`, issue 60 item 13). Restored on exit."""
    before = sys.getswitchinterval()
    if ms > 0:
        sys.setswitchinterval(ms / 1000)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


async def monitor_loop_lag(counters: PhaseCounters, period_s: float = 0.01) -> None:
    """Overshoot of a 10 ms sleep: how long the Trio loop was kept from running ready tasks."""
    while True:
        before = trio.current_time()
        await trio.sleep(period_s)
        counters.loop_lag.add(max(0.0, trio.current_time() - before - period_s))


async def host_nursery(*, task_status: Any) -> None:
    """A nursery for tasks started later by others (its owner's scope cancels it)."""
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep_forever()


async def set_on(source: trio.Event, target: trio.Event) -> None:
    await source.wait()
    target.set()


class AnnouncedSender:
    """Sends training groups to an in-process learner: `expect(group_id)` first, then the channel."""

    def __init__(self, expect: Any, channel: trio.MemorySendChannel[Any]) -> None:
        self._expect, self._channel = expect, channel

    async def send(self, group: Any) -> None:
        self._expect(group.group_id)
        await self._channel.send(group)


async def send_all(zmq: Context, address: str, hwm: int, inbox: trio.MemoryReceiveChannel[Any], *, task_status: Any) -> None:
    """Own one PUSH socket and forward everything from a memory channel."""
    push = zmq.socket("push", address, bind=False, hwm=hwm)
    async with push, inbox:
        task_status.started()
        async for message in inbox:
            await push.send(message)
