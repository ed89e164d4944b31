"""Task ranges: dev / valid / test are disjoint, stable across runs, dev is what was measured before them, and
the warm start (behaviour cloning with noise, DAgger) and GRPO's train tasks touch none of them."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from pipeline.config import ConfigError, PolicySection, PretrainSection, load_config
from pipeline.contracts import Task
from pipeline.run import build
from pipeline.run.heldout import curve_tasks, heldout_tasks
from pipeline.task_ranges import DEFAULT_SIZES, FINAL, RANGES, heldout_ranges, range_bounds, task_range
from stages.envs.household.suite import HouseholdSuite
from stages.policy.torch_tiny import torch_tiny_backend

SIZES = {"dev": 200, "valid": 200, "test": 400}
HELDOUT = ("heldout_seen", "heldout_unseen")


def _tasks(n: int, split: str = "heldout_seen") -> list[Task]:
    return [Task(f"t/{split}/{i}", "f", "d", split) for i in range(n)]


def test_ranges_are_consecutive_disjoint_and_dev_comes_first():
    assert range_bounds(SIZES) == {"dev": (0, 200), "valid": (200, 400), "test": (400, 800), "final": (800, 800)}
    tasks = _tasks(1000)
    chosen = {name: task_range(tasks, name, SIZES) for name in RANGES}
    assert [len(chosen[n]) for n in RANGES] == [200, 200, 400]
    ids = [t.task_id for n in RANGES for t in chosen[n]]
    assert len(set(ids)) == len(ids) == 800
    assert task_range(tasks, "test", SIZES, 3) == tasks[400:403]
    with pytest.raises(ValueError, match="holds 200"):
        task_range(tasks, "valid", SIZES, 201)
    with pytest.raises(ValueError, match="unknown task range"):
        task_range(tasks, "train", SIZES)


def test_a_short_split_fills_the_first_ranges_and_an_empty_range_is_left_out_with_a_warning():
    splits = {"a": _tasks(250, "a"), "b": _tasks(150, "b")}
    with capture_logs() as logs:
        chosen = heldout_ranges(splits.__getitem__, ["a", "b"], "valid", SIZES, 100)
    assert chosen == {"a": splits["a"][200:250]}  # b ends before valid starts
    assert {e["event"] for e in logs} == {"eval.short_range", "eval.empty_range"}


def test_household_ranges_are_stable_across_runs_and_dev_is_the_first_200_tasks_measured_before():
    first = load_config(None, ["run.seed=0"])
    other = load_config(None, ["run.seed=7", "eval.range=\"test\"", "eval.tasks=400", "eval.every=4"])
    suite_a, suite_b = build.suite(first), build.suite(other)  # two runs' suites, another run seed
    dev = heldout_tasks(first, suite_a)
    assert {s: [t.task_id for t in ts] for s, ts in dev.items()} == {
        s: [t.task_id for t in list(suite_b.tasks(s))[:200]] for s in HELDOUT}  # what eval.tasks = 200 measured
    test = heldout_tasks(other, suite_b)
    assert [len(test[s]) for s in HELDOUT] == [400, 400]  # the default splits hold all three ranges
    assert {t.task_id for t in test["heldout_seen"]} == {t.task_id for t in task_range(suite_a.tasks("heldout_seen"), "test", SIZES)}
    valid = curve_tasks(other, suite_b)  # the periodic measure: valid, min(eval.tasks, 200)
    assert [len(valid[s]) for s in HELDOUT] == [200, 200]
    for split in HELDOUT:
        ids = [{t.task_id for t in ranges[split]} for ranges in (dev, valid, test)]
        assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
        specs = [{suite_a.spec(t).signature for t in ranges[split]} for ranges in (dev, valid, test)]
        assert sum(map(len, specs)) == len(set().union(*specs))  # no task repeats under another id either


def test_the_config_refuses_a_curve_or_stop_rule_on_test_and_more_tasks_than_a_range_holds():
    with pytest.raises(ConfigError) as info:
        load_config(None, ['eval.curve_range="test"', "eval.tasks=201", 'eval.range="train"', "eval.ranges.test=-1"])
    text = str(info.value)
    assert "never look at the test range" in text and "eval.range must be one of dev, valid, test" in text
    assert "eval.ranges.test must be >= 0" in text
    with pytest.raises(ConfigError, match=r"eval.tasks \(201\) is more than the dev range holds"):
        load_config(None, ["eval.tasks=201"])


class _SpySuite(HouseholdSuite):
    """The household suite, recording which splits are listed and which tasks are played."""

    def __init__(self, **options: object) -> None:
        super().__init__(HouseholdSuite.Options(**options), max_steps=8)
        self.listed: set[str] = set()
        self.played: list[str] = []

    def tasks(self, split: str):  # noqa: ANN201
        self.listed.add(split)
        return super().tasks(split)

    def make(self):  # noqa: ANN201
        env = super().make()
        reset = env.reset

        def spy(task: Task):  # noqa: ANN202
            self.played.append(task.task_id)
            return reset(task)

        env.reset = spy
        return env


def test_the_warm_start_with_noise_and_dagger_plays_train_tasks_only(tmp_path):
    suite = _SpySuite()
    heldout = {t.task_id for s in HELDOUT for name in RANGES for t in task_range(suite.tasks(s), name, SIZES)}
    heldout |= {t.task_id for s in HELDOUT for t in task_range(suite.tasks(s), FINAL, DEFAULT_SIZES, verdict="spy")}
    suite.listed.clear()
    policy = PolicySection(max_new_tokens=8, cache_dir=str(tmp_path), options={
        "layers": 1, "d_model": 16, "heads": 2, "max_len": 128, "max_prompt_tokens": 100, "bc_eval_tasks": 0})
    pretrain = PretrainSection(demos=6, epochs=1, batch_size=8, noise=0.3, dagger_rounds=1, dagger_tasks=3, dagger_epochs=1)
    torch_tiny_backend(policy, pretrain, suite, seed=0)
    assert suite.listed == {"train"}
    assert len(set(suite.played)) == 9 and all(t.startswith("household/train/") for t in suite.played)
    assert not heldout & set(suite.played)
