"""docs/plugins.md works as the page says: its stage reads the decoded event stream to `PhaseFinished` and
returns on its own, its gate cuts as described, its examples import, and its message tables are generated
from the classes (the whole try-your-plugin run: `tests/test_try_plugin_integration.py`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import trio

from pipeline import messages
from pipeline.config import TransportSection
from pipeline.message_docs import field_docs, render
from pipeline.message_docs import main as message_docs_main
from pipeline.messages import (
    CancelGroup,
    GroupDropped,
    GroupResult,
    PhaseFinished,
    StepEvent,
    Trajectory,
    TrajectoryStatus,
    WeightsPublished,
)
from pipeline.plugins import build_plugin, option_problems
from pipeline.profiling import Profiler
from pipeline.stage import StageContext
from pipeline.transport import open_context

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def plugin_module() -> str:
    """`myplugins.py` as the page gives it: its three blocks, in order."""
    parts = [b for b in _blocks() if b.startswith("# myplugins.py (")]
    assert [p.split("\n", 1)[0][:20] for p in parts] == ["# myplugins.py (1/3)", "# myplugins.py (2/3)", "# myplugins.py (3/3)"]
    return "\n".join(parts)


def _plugins() -> dict:
    namespace: dict = {}
    exec(compile(plugin_module(), str(DOC), "exec", dont_inherit=True), namespace)
    return namespace


async def test_the_documented_stage_counts_everything_and_returns_at_phase_finished(tmp_path):
    stage = build_plugin(_plugins()["FateCounter"], {"path": "fates.json"}, "stages[0].options", "stage 'fate_counter'")
    addresses = TransportSection(events="inproc://doc-events")
    done = Trajectory(rollout_index=0, turns=[], reward=0.0, success=False, status=TrajectoryStatus.COMPLETE)
    async with open_context() as zmq:
        pub = zmq.socket("pub", addresses.events, bind=True)
        ctx = StageContext(zmq=zmq, addresses=addresses, run_dir=tmp_path, profiler=Profiler(enabled=False))
        async with pub, trio.open_nursery() as nursery:
            await nursery.start(stage.run, ctx)
            await trio.sleep(0.05)  # PUB/SUB has no event for "subscription arrived" (the slow-joiner gap)
            for gid in range(3):
                await pub.send(GroupResult(group_id=gid, task_id="t", trajectories=[done, done], cut=gid == 1))
            await pub.send(CancelGroup(group_id=1, reason="r", gate="g", value=0.0))
            await pub.send(CancelGroup(group_id=2, reason="r", gate="g", value=0.0, shadow=True))  # not a cut
            await pub.send(WeightsPublished(version=4, groups_trained=8, published_at=0.0))
            await pub.send(GroupDropped(group_id=0, reason="all_fail"))
            await pub.send(GroupDropped(group_id=2, reason="run_ended"))
            await pub.send(PhaseFinished(updates=4, stop_reason="updates"))
            # leaving the nursery waits for the stage, which must return by itself on PhaseFinished
    counts = json.loads((tmp_path / "fates.json").read_text())
    assert {k: counts[k] for k in ("groups", "cut", "trained", "dropped")} == {
        "groups": 3, "cut": 1, "trained": 8, "dropped": {"all_fail": 1, "run_ended": 1}}


def test_the_documented_gate_cuts_once_every_rollout_repeated_an_action():
    gate = build_plugin(_plugins()["RepeatGate"], {}, "gate.options", "gate 'repeat'")
    gate.open(5, 2)

    def step(rollout, index, action):
        return gate.observe(StepEvent(group_id=5, rollout_index=rollout, step_index=index, action=action, done=False,
                                      reward=0.0, policy_version=0))

    assert [step(0, i, "look") for i in range(3)] == [None] * 3  # rollout 0 is stuck, rollout 1 not yet
    assert step(1, 0, "go") is None and step(1, 1, "open") is None and step(1, 2, "open") is None
    decision = step(1, 3, "open")
    assert decision is not None and decision.cut and decision.checkpoint == 4
    assert gate.close(5) == []


def test_the_gate_example_s_imports_resolve():
    (code,) = [b for b in _blocks() if "class MyGate" in b]
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec", dont_inherit=True), namespace)
    assert set(namespace["MyGate"].Options.__struct_fields__) == {"k", "tau", "checkpoints", "window"}


def test_the_message_field_tables_are_generated_from_the_classes():
    """docs/plugins.md's tables are `pipeline.message_docs`'s output: a field added, renamed or redocumented in
    pipeline/messages.py without regenerating them fails here."""
    text = DOC.read_text()
    assert render(text) == text, "stale tables: run python -m pipeline.message_docs docs/plugins.md"
    shown = set(re.findall(r"<!-- fields:(\w+) -->", text))
    assert {"GroupResult", "Trajectory", "StepEvent", "GroupClosed", "WeightsPublished", "CancelGroup", "GroupDropped"} <= shown
    for name in shown:  # and every field of them says what it means
        cls = getattr(messages, name)
        docs = field_docs(cls)
        assert all(docs[f][1] for f in cls.__struct_fields__), (name, [f for f in cls.__struct_fields__ if not docs[f][1]])


def test_a_stale_table_is_found_and_rewritten(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("x\n<!-- fields:GroupDropped -->\n| old |\n<!-- /fields -->\n")
    assert message_docs_main(["--check", str(page)]) == 1
    assert message_docs_main([str(page)]) == 0 and message_docs_main(["--check", str(page)]) == 0
    assert "| `reason` | `str` | required |" in page.read_text()


def test_the_documented_options_struct_is_built_as_the_page_says():
    (code,) = [b for b in _blocks() if "class MyThing" in b]
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
