"""The stage written in docs/plugins.md works as the page says: it reads the decoded event stream, sees
every event up to `PhaseFinished` (the last `WeightsPublished` included) and returns on its own."""

from __future__ import annotations

import json
import re
from pathlib import Path

import trio

from pipeline.config import TransportSection
from pipeline.messages import CancelGroup, GroupResult, PhaseFinished, WeightsPublished
from pipeline.plugins import build_plugin, option_problems
from pipeline.profiling import Profiler
from pipeline.stage import StageContext
from pipeline.transport import open_context

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def _stage_class():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    (code,) = [b for b in blocks if "async def run" in b and "import" in b]
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace["CutCounter"]


async def test_the_documented_stage_counts_everything_and_returns_at_phase_finished(tmp_path):
    stage = build_plugin(_stage_class(), {"path": "cuts.json"}, "stages[0].options", "stage 'cut_counter'")
    addresses = TransportSection(events="inproc://doc-events")
    async with open_context() as zmq:
        pub = zmq.socket("pub", addresses.events, bind=True)
        ctx = StageContext(zmq=zmq, addresses=addresses, run_dir=tmp_path, profiler=Profiler(enabled=False))
        async with pub, trio.open_nursery() as nursery:
            await nursery.start(stage.run, ctx)
            await trio.sleep(0.05)  # PUB/SUB has no event for "subscription arrived" (the slow-joiner gap)
            for gid in range(3):
                await pub.send(GroupResult(group_id=gid, task_id="t", trajectories=[], cut=gid == 1))
            await pub.send(CancelGroup(group_id=1, reason="r", gate="g", value=0.0))
            await pub.send(WeightsPublished(version=4, groups_trained=8, published_at=0.0))
            await pub.send(PhaseFinished(updates=4, stop_reason="updates"))
            # leaving the nursery waits for the stage, which must return by itself on PhaseFinished
    assert json.loads((tmp_path / "cuts.json").read_text()) == {"groups": 3, "cut": 1, "cancels": 1, "versions": 4}


def test_the_documented_options_struct_is_built_as_the_page_says():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    (code,) = [b for b in blocks if "class MyThing" in b]
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec", dont_inherit=True), namespace)  # (not this file's __future__ import)
    thing = namespace["MyThing"]
    assert build_plugin(thing, {"window": 3}, "w", "thing").window == 3
    assert build_plugin(thing, {}, "w", "thing").window == 5
    assert option_problems(thing, {"window": 0, "lable": "x"}, "stages[0].options", "thing") == [
        "stages[0].options.window: Expected `int` >= 1",
        "stages[0].options.lable: unknown option for thing (known: label, window)",
    ]



def test_the_page_lists_exactly_the_entry_point_groups_the_registries_read():
    root = DOC.parents[1]
    kinds = set()
    for path in [*root.glob("pipeline/**/*.py"), *root.glob("stages/**/*.py"), *root.glob("gates/**/*.py"),
                 *root.glob("learner/**/*.py")]:
        kinds |= set(re.findall(r"\bRegistry\(\s*\"(\w+)\"", path.read_text()))
    groups = re.search(r"^Groups \(.*?\): (.*?)\. An unknown name", DOC.read_text(), flags=re.S | re.M)
    assert groups is not None
    assert set(re.findall(r"`(rollcut\.\w+)`", groups.group(1))) == {f"rollcut.{kind}" for kind in kinds}
