"""An example custom stage: write every finished group to a JSON-lines file.

Use it without editing rollcut:

    [[stages]]
    target = "examples.jsonl_writer:JsonlGroupWriter"
    options = { path = "groups.jsonl" }   # relative paths land in the run folder

or register it under the `rollcut.stages` entry-point group of your own package.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import trio

from pipeline.messages import GroupResult, PhaseFinished
from pipeline.stage import StageContext


class JsonlGroupWriter:
    name = "jsonl_writer"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        path: str = "groups.jsonl"
        """Relative paths land in the run folder."""
        include_tokens: bool = False
        """Write each turn's token ids and log-probs (else only the actions)."""

    def __init__(self, options: Options = Options()) -> None:  # noqa: B008 (a frozen Struct)
        self.path = options.path
        self.include_tokens = options.include_tokens
        self.written = 0

    def _row(self, group: GroupResult) -> dict:
        row = msgspec.to_builtins(group)
        if not self.include_tokens:
            for trajectory in row["trajectories"]:
                trajectory["actions"] = [turn[3] for turn in trajectory.pop("turns")]  # Turn is array-like
        return row

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        target = Path(self.path)
        if not target.is_absolute():
            target = ctx.run_dir / target
        encoder = msgspec.json.Encoder()
        events = ctx.subscribe()
        with target.open("ab") as out:
            async with events:
                task_status.started()
                async for message in events:
                    if isinstance(message, PhaseFinished):
                        return  # the last message of the stream: everything before it was written
                    if isinstance(message, GroupResult):
                        out.write(encoder.encode(self._row(message)) + b"\n")
                        out.flush()
                        self.written += 1
