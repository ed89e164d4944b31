"""A Ray fault for tests: an observer stage that kills one of the run's actors (by default decoding worker 0;
`actor = "learner"` the learner stage's) once the learner has published `after` weight versions, once per run
folder (a resumed run finds its mark and leaves the actors alone). Loaded by `module:attr` like any stage;
imports Ray only when it runs."""

from __future__ import annotations

import msgspec
import trio

from pipeline.messages import WeightsPublished
from pipeline.stage import StageContext


class KillDecoder:
    name = "kill_decoder"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        after: int = 1
        actor: str = "decoder-0"
        """The actor's name without its prefix and tag: `decoder-<i>`, `gate`, `learner`."""

    def __init__(self, options: Options) -> None:
        self.after, self.actor = options.after, options.actor

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        import ray

        mark = ctx.run_dir / "killed-decoder"
        events = ctx.subscribe()
        async with events:
            task_status.started()
            async for message in events:
                if isinstance(message, WeightsPublished) and message.version >= self.after and not mark.exists():
                    mark.write_text("")
                    for named in ray.util.list_named_actors(all_namespaces=True):
                        if named["name"].startswith(f"rollcut-{self.actor}-"):
                            ray.kill(ray.get_actor(named["name"], namespace=named["namespace"]), no_restart=True)
