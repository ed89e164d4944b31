from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import trio

from pipeline.progress import Progress
from stages.evaluate import evaluate, evaluate_splits
from stages.policy.base import ActResult, AgentContext
from tests.stages.policy.fake_suite import FindSuite


class ScriptedPolicy:
    """Goes to the place the hint names, then takes the object; `blind` tasks only look around."""

    def __init__(self, blind: str = "") -> None:
        self.version = 0
        self.blind = blind
        self.live = 0
        self.most_live = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def act(self, context: AgentContext, *, greedy: bool = False) -> ActResult:
        self.live += 1
        self.most_live = max(self.most_live, self.live)
        await trio.sleep(0.01)
        self.live -= 1
        target = context.task.removeprefix("take the ")
        if target == self.blind:
            action = "look"
        elif not context.history:
            action = "go to " + context.observation.split(" is on ")[1].rstrip(".")
        else:
            action = f"take {target} from {context.history[-1][1].removeprefix('go to ')}"
        return ActResult(action, action, [], [], [], self.version)

    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        raise AssertionError("evaluate() must never load weights")

    def trainable(self) -> Any:
        raise AssertionError("evaluate() must never ask for a trainable copy")


async def test_success_per_family_and_steps() -> None:
    suite = FindSuite(max_steps=4, per_split=20)
    report = await evaluate(ScriptedPolicy(), suite, suite.tasks("heldout_seen"))
    assert report.success == 1.0
    assert report.per_family == {"find": 1.0}
    assert report.mean_steps == 2.0
    assert len(report.episodes) == 20


async def test_failures_count_and_run_to_the_step_limit() -> None:
    suite = FindSuite(max_steps=4, per_split=20)  # seen objects cycle apple, book, key, cup
    report = await evaluate(ScriptedPolicy(blind="key"), suite, suite.tasks("heldout_seen"))
    assert report.success == 0.75
    assert report.mean_steps == 0.75 * 2 + 0.25 * 4
    assert {e.task_id for e in report.episodes if not e.won} == {
        t.task_id for t in suite.tasks("heldout_seen") if t.description == "take the key"
    }


async def test_episodes_run_concurrently_up_to_the_limit() -> None:
    suite = FindSuite(per_split=20)
    policy = ScriptedPolicy()
    await evaluate(policy, suite, suite.tasks("train"), concurrency=7)
    assert policy.most_live == 7


async def test_all_splits_play_at_once_and_report_per_split() -> None:
    suite = FindSuite(max_steps=4, per_split=12)  # seen cycles apple, book, key, cup; unseen is all pens
    policy = ScriptedPolicy(blind="pen")
    splits = {s: suite.tasks(s) for s in ("heldout_seen", "heldout_unseen")}
    stream = io.StringIO()
    Progress(0, stream=stream).activate()
    reports = await evaluate_splits(policy, suite, splits)
    assert policy.most_live == 24  # every episode of both splits in flight together
    assert {s: r.success for s, r in reports.items()} == {"heldout_seen": 1.0, "heldout_unseen": 0.0}
    assert [len(r.episodes) for r in reports.values()] == [12, 12]
    assert [e.task_id for e in reports["heldout_seen"].episodes] == [t.task_id for t in splits["heldout_seen"]]
    line = stream.getvalue()
    assert line.startswith("held-out 24/24 | heldout_seen 100.0%, heldout_unseen 0.0% | ") and line.count("\n") == 1
