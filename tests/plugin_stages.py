"""User-style stage plugins loaded by `module:Class` in integration tests."""

import json
import os

import msgspec
import trio

from pipeline.messages import GroupResult, PhaseFinished, WeightsPublished
from tests.plugin_faults import STOPS


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


class SeenToFile:
    """Writes what it saw (the versions published, whether PhaseFinished came, its pid) to `seen.json` in the run
    folder: a stage in a process of its own (`process = true`) keeps nothing in the test's memory."""

    name = "seen_to_file"

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        versions = []
        async with ctx.subscribe() as events:
            task_status.started()
            async for message in events:
                if isinstance(message, WeightsPublished):
                    versions.append(message.version)
                if isinstance(message, PhaseFinished):
                    seen = {"pid": os.getpid(), "versions": versions, "updates": message.updates}
                    (ctx.run_dir / "seen.json").write_text(json.dumps(seen))
                    return


class StopOnCutsAndUpdates:
    """Sets `plugin_faults.STOPS[key]` once `cuts` cut groups have finished and the learner has published
    `updates` versions; or, to fail on a count rather than on a timeout, at `give_up` versions whatever the
    cuts or at `give_up_cuts` cut groups whatever the updates (a gate that cuts everything). A test waits
    on what it asserts, not on the machine being fast."""

    name = "stop_on_cuts_and_updates"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        key: str
        cuts: int = 1
        updates: int = 2
        give_up: int = 20
        give_up_cuts: int = 40

    def __init__(self, options: Options) -> None:
        self.options = options

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        cuts = version = 0
        async with ctx.subscribe() as events:
            task_status.started()
            async for message in events:
                if isinstance(message, GroupResult) and message.cut:
                    cuts += 1
                if isinstance(message, WeightsPublished):
                    version = message.version
                o = self.options
                if (cuts >= o.cuts and version >= o.updates) or version >= o.give_up or cuts >= o.give_up_cuts:
                    STOPS[o.key].set()


class StopOnLaterStageGroups:
    """Sets `plugin_faults.STOPS[key]` once `groups` finished groups of a later stage (an allocator's sub-group:
    a Pilot-Commit commit, an AERO rescue) have been published, and the first-stage groups before them
    with them: what a test of how the gate treats sub-groups needs to have seen. (AERO on the tiny policy
    never trains, every group is in its dead zone, so a run of N updates would never end.)"""

    name = "stop_on_later_stage_groups"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        key: str
        groups: int = 2

    def __init__(self, options: Options) -> None:
        self.options = options

    async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
        later = 0
        async with ctx.subscribe() as events:
            task_status.started()
            async for message in events:
                later += isinstance(message, GroupResult) and message.kind not in ("group", "pilot", "explore")
                if later >= self.options.groups:
                    STOPS[self.options.key].set()
                    return
