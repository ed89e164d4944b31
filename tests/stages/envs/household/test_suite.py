import pytest

from stages.envs import ENVS, Environment, EnvSuite, Task, build_suite, check_suite
from stages.envs.household import HouseholdSuite


def test_registered_and_constructed_from_options():
    suite_class = ENVS.get("household")
    assert suite_class is HouseholdSuite
    suite = build_suite("household", {"seed": 3, "train_size": 10, "heldout_seen_size": 5, "heldout_unseen_size": 5}, max_steps=12)
    assert isinstance(suite, EnvSuite)
    assert isinstance(suite.make(), Environment)
    assert (suite.name, suite.max_steps) == ("household", 12)
    assert [len(suite.tasks(split)) for split in ("train", "heldout_seen", "heldout_unseen")] == [10, 5, 5]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"families": ["juggling"]}, "families must be a non-empty subset"),
        ({"families": []}, "families must be a non-empty subset"),
        ({"unseen_combination_share": 1.0}, "env.options.unseen_combination_share: Expected `float` < 1.0"),
        ({"expert": "psychic"}, "env.options.expert: Invalid enum value 'psychic'"),
        ({"train_sise": 10}, "env.options.train_sise: unknown option for env 'household'"),
    ],
)
def test_bad_options_are_named(options, message):
    assert any(message in problem for problem in check_suite("household", options))
    with pytest.raises(ValueError, match="invalid options for env 'household'"):
        build_suite("household", options, max_steps=30)


def test_a_step_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        HouseholdSuite(max_steps=0)


def test_restricting_families():
    suite = HouseholdSuite(HouseholdSuite.Options(train_size=20, families=["pick_heat_then_place", "pick_cool_then_place"]))
    assert {t.family for t in suite.tasks("train")} == {"pick_heat_then_place", "pick_cool_then_place"}


def test_unknown_splits_and_foreign_tasks_raise_clear_errors():
    suite = HouseholdSuite(HouseholdSuite.Options(train_size=5))
    with pytest.raises(ValueError, match="unknown split"):
        suite.tasks("test")
    foreign = Task("textworld/train/000001", "pick_and_place", "win", "train")
    with pytest.raises(ValueError, match="not a household task id"):
        suite.make().reset(foreign)
    with pytest.raises(ValueError, match="has only 5 tasks"):
        suite.expert(Task("household/train/000005", "pick_and_place", "win", "train"))


def test_stepping_before_reset_raises():
    with pytest.raises(RuntimeError):
        HouseholdSuite(HouseholdSuite.Options(train_size=1)).make().step("look")


def test_the_expert_option_picks_the_planner():
    omniscient = HouseholdSuite(HouseholdSuite.Options(train_size=40))
    searching = HouseholdSuite(HouseholdSuite.Options(train_size=40, expert="searching"))
    tasks = omniscient.tasks("train")
    assert [t.task_id for t in tasks] == [t.task_id for t in searching.tasks("train")]
    short = sum(len(omniscient.expert(t)) for t in tasks)
    assert short < sum(len(searching.expert(t)) for t in searching.tasks("train"))
    env = omniscient.make()
    for task in tasks[:10]:
        env.reset(task)
        result = None
        for command in omniscient.expert(task):
            result = env.step(command)
        assert result is not None and result.won
