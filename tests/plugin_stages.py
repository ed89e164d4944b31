"""User-style stage plugins loaded by `module:Class` in integration tests."""

import trio

from pipeline.messages import PhaseFinished, WeightsPublished


class Explodes:
    """Raises at the first published weights: the run must stop with one message naming it."""

    name = "explodes"

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        async with ctx.subscribe() as events:
            task_status.started()
            async for message in events:
                if isinstance(message, WeightsPublished):
                    raise ValueError("the plugin has a bug")


class Recorder:
    """Keeps every version it sees and whether the stream ended with PhaseFinished."""

    name = "recorder"
    seen: list = []

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        async with ctx.subscribe() as events:
            task_status.started()
            async for message in events:
                if isinstance(message, WeightsPublished):
                    Recorder.seen.append(message.version)
                if isinstance(message, PhaseFinished):
                    Recorder.seen.append("finished")
                    return
