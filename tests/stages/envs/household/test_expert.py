from dataclasses import replace

import pytest

from stages.envs.base import SPLITS
from stages.envs.household.catalog import FAMILIES
from stages.envs.household.expert import plan, search_order

from .conftest import SPLIT_SIZE


@pytest.mark.parametrize("split", SPLITS)
def test_expert_plans_replay_and_win_on_every_task(suite, split):
    tasks = suite.tasks(split)
    assert len(tasks) == SPLIT_SIZE
    env = suite.make()
    for task in tasks:
        observation = env.reset(task)
        plan = suite.expert(task)
        assert len(plan) == task.features["expert_steps"]
        for command in plan:
            assert command in observation.admissible, (task.task_id, plan, command)
            result = env.step(command)
            observation = result.observation
        assert (result.won, result.reward) == (True, 1.0), (task.task_id, plan)


def test_plans_open_exactly_the_closed_receptacles_on_their_path(suite):
    for task in suite.tasks("train")[:200]:
        plan = suite.expert(task)
        opened = [command for command in plan if command.startswith("open ")]
        assert len(opened) == task.features["closed_on_path"]
        assert len(set(opened)) == len(opened)


def test_plan_lengths_grow_with_the_family_work(suite):
    mean = {}
    for family in FAMILIES:
        lengths = [len(suite.expert(t)) for t in suite.tasks("train") if t.family == family]
        mean[family] = sum(lengths) / len(lengths)
    assert mean["look_at_obj_in_light"] < mean["pick_and_place"] < mean["pick_heat_then_place"]
    assert mean["pick_heat_then_place"] < mean["pick_two_obj_and_place"]


def test_expert_returns_a_fresh_list(suite):
    task = suite.tasks("train")[0]
    suite.expert(task).append("look")
    assert suite.expert(task)[-1] != "look"


def _searching(suite, split: str, count: int):
    """(task, spec, plan) of the first `count` tasks of `split` whose plan is the searching expert's."""
    for task in suite.tasks(split)[:count]:
        spec = suite.spec(task)
        commands = suite.expert(task)
        if commands == plan(spec, max_steps=10**6):
            yield task, spec, commands


def _visited(spec, commands) -> set[int]:
    index = {name: i for i, name in enumerate(spec.layout.names)}
    return {index[command[len("go to ") :]] for command in commands if command.startswith("go to ")}


@pytest.mark.parametrize("split", SPLITS)
def test_search_follows_the_canonical_order_until_the_first_take(suite, split):
    for task, spec, commands in _searching(suite, split, 300):
        first_take = next(i for i, command in enumerate(commands) if command.startswith("take "))
        order = [spec.layout.names[rec] for rec in search_order(spec)]
        visits = [command[len("go to ") :] for command in commands[:first_take] if command.startswith("go to ")]
        assert visits == order[: len(visits)], (task.task_id, commands)


@pytest.mark.parametrize("split", SPLITS)
def test_plans_ignore_objects_in_receptacles_never_visited(suite, split):
    """The expert acts on what it saw: emptying every receptacle it never went to changes nothing."""
    for task, spec, commands in _searching(suite, split, 300):
        visited = _visited(spec, commands)
        kept = tuple((name, rec) for name, rec in spec.objects if rec in visited)
        assert plan(replace(spec, objects=kept)) == commands, task.task_id


def test_searching_plans_are_longer_than_omniscient_ones_and_rarely_fall_back(suite):
    env = suite.make()
    searching = omniscient = fallbacks = 0
    tasks = suite.tasks("train")
    for task in tasks:
        spec = suite.spec(task)
        short = plan(spec, omniscient=True)
        full = plan(spec, max_steps=10**6)
        assert len(short) <= len(full)
        searching += len(full)
        omniscient += len(short)
        fallbacks += suite.expert(task) == short != full
        if task.task_id.endswith("0"):  # the omniscient plan still wins
            observation = env.reset(task)
            for command in short:
                assert command in observation.admissible
                result = env.step(command)
                observation = result.observation
            assert result.won
    assert searching > 1.3 * omniscient
    assert fallbacks <= len(tasks) // 100


def test_a_shorter_step_limit_falls_back_to_the_omniscient_plan(suite):
    spec = suite.spec(next(t for t in suite.tasks("train") if t.features["expert_steps"] > 12))
    assert len(plan(spec)) > 12
    assert plan(spec, max_steps=12) == plan(spec, omniscient=True)
