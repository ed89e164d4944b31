import pytest

from stages.envs.base import SPLITS
from stages.envs.household.catalog import FAMILIES

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
