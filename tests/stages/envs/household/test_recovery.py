import random

import pytest

from stages.envs.base import SPLITS, RecoveringExpert
from stages.envs.household import HouseholdEnv, HouseholdSuite
from stages.envs.household.catalog import RECEPTACLE_KINDS
from stages.envs.household.expert import plan, search_order
from stages.envs.household.recovery import next_command

from .conftest import SPLIT_SIZE


def _follow(suite, env, observation, limit: int) -> tuple[list[str], bool]:
    """Follow the recovering expert from the env's current state; every command must be admissible."""
    commands: list[str] = []
    for _ in range(limit):
        command = suite.expert_action(env)
        assert command in observation.admissible, (commands, command)
        commands.append(command)
        result = env.step(command)
        observation = result.observation
        if result.done:
            return commands, result.won
    return commands, False


def test_the_suite_offers_a_recovering_expert(suite):
    assert isinstance(suite, RecoveringExpert)
    with pytest.raises(ValueError, match="reset"):
        suite.expert_action(suite.make())


@pytest.mark.parametrize("split", SPLITS)
def test_from_the_initial_state_it_replays_the_omniscient_plan(suite, split):
    env = suite.make()
    for task in suite.tasks(split)[:300]:
        observation = env.reset(task)
        commands, won = _follow(suite, env, observation, suite.max_steps)
        assert won and commands == plan(suite.spec(task), omniscient=True), task.task_id


@pytest.mark.parametrize("detour", [1, 4, 10, 20])
def test_it_wins_after_any_random_detour(suite, detour):
    rng = random.Random(detour)
    env = HouseholdEnv(suite.spec, max_steps=200)  # the detour must not eat the step limit
    for task in suite.tasks("train")[:250]:
        observation = env.reset(task)
        for _ in range(detour):
            observation = env.step(rng.choice(observation.admissible)).observation
        if not observation.admissible:  # the detour happened to win
            continue
        omniscient = len(plan(suite.spec(task), omniscient=True))
        commands, won = _follow(suite, env, observation, 3 * omniscient + 4)
        assert won, (task.task_id, commands)


def _take_goal(suite, task):
    """An env of `task` right after the omniscient plan's first `take`."""
    env = suite.make()
    env.reset(task)
    for command in plan(suite.spec(task), omniscient=True):
        env.step(command)
        if command.startswith("take"):
            return env
    raise AssertionError("the plan takes nothing")


def test_a_wrongly_heated_object_is_cooled_before_it_is_put_away(suite):
    task = next(
        t for t in suite.tasks("train")
        if t.family == "pick_cool_then_place" and "microwave" in suite.spec(t).layout.kinds
    )
    spec = suite.spec(task)
    env = _take_goal(suite, task)
    held = env.world().names[env.world().held]
    microwave = spec.layout.names[spec.layout.kinds.index("microwave")]
    fridge = spec.layout.names[spec.layout.kinds.index("fridge")]
    assert env.step(f"go to {microwave}").info["valid"] and env.step(f"heat {held} with {microwave}").info["valid"]
    assert next_command(spec, env.world()) == f"go to {fridge}"
    env.step(f"go to {fridge}")
    assert next_command(spec, env.world()) == f"cool {held} with {fridge}"


def test_a_wrong_object_is_put_back_where_the_agent_stands(suite):
    env = suite.make()
    for task in suite.tasks("train"):
        spec = suite.spec(task)
        env.reset(task)
        wrong = [
            (name, rec) for name, rec in spec.objects
            if not name.startswith(spec.goal_kind + " ") and not RECEPTACLE_KINDS[spec.layout.kinds[rec]].openable
        ]
        if wrong:
            break
    name, rec = wrong[0]
    here = spec.layout.names[rec]
    env.step(f"go to {here}")
    assert env.step(f"take {name} from {here}").info["valid"]
    assert next_command(spec, env.world()).startswith(f"put {name} ") and next_command(spec, env.world()).endswith(here)


def _searching_suite(suite):
    options = HouseholdSuite.Options(
        train_size=SPLIT_SIZE, heldout_seen_size=SPLIT_SIZE, heldout_unseen_size=SPLIT_SIZE, recovery="searching"
    )
    return HouseholdSuite(options, max_steps=suite.max_steps)


@pytest.mark.parametrize("detour", [0, 4, 20])
def test_the_searching_recovery_wins_after_any_random_detour(suite, detour):
    searching = _searching_suite(suite)
    rng = random.Random(detour)
    env = HouseholdEnv(searching.spec, max_steps=300)
    for task in searching.tasks("train")[:250]:
        observation = env.reset(task)
        for _ in range(detour):
            observation = env.step(rng.choice(observation.admissible)).observation
        if not observation.admissible:
            continue
        commands, won = _follow(searching, env, observation, 200)
        assert won, (task.task_id, commands)


def test_the_searching_recovery_takes_only_goal_objects_it_has_seen(suite):
    """Followed from the start, every `take` comes from a receptacle the agent has seen inside."""
    searching = _searching_suite(suite)
    env = HouseholdEnv(searching.spec, max_steps=200)
    takes = 0
    for task in searching.tasks("train")[:300]:
        env.reset(task)
        spec = searching.spec(task)
        for _ in range(200):
            world = env.world()
            command = searching.expert_action(env)
            if command.startswith("take "):
                rec = spec.layout.names.index(command.rsplit(" from ", 1)[1])
                assert world.looked[rec], (task.task_id, command)
                takes += 1
            result = env.step(command)
            if result.done:
                assert result.won, task.task_id
                break
    env.close()
    assert takes >= 300


def test_the_searching_labels_differ_from_the_omniscient_ones_where_the_goal_is_hidden(suite):
    """From a task's first state (nothing seen yet) the searching label is the first receptacle of the
    search order; the omniscient label walks to the goal object, a different place on some tasks."""
    searching = _searching_suite(suite)
    env = searching.make()
    differ = 0
    for task in searching.tasks("train")[:200]:
        env.reset(task)
        spec = searching.spec(task)
        label = searching.expert_action(env)
        assert label == f"go to {spec.layout.names[search_order(spec)[0]]}", (task.task_id, label)
        differ += label != next_command(spec, env.world())
    env.close()
    assert differ > 0


def test_mixed_recovery_labels_a_fixed_share_of_tasks_with_the_searching_expert(suite):
    options = dict(train_size=SPLIT_SIZE, heldout_seen_size=SPLIT_SIZE, heldout_unseen_size=SPLIT_SIZE, recovery="mixed")
    mixed = HouseholdSuite(HouseholdSuite.Options(**options, searching_share=0.3), max_steps=suite.max_steps)
    tasks = mixed.tasks("train")[:300]
    chosen = [mixed.searches(mixed.spec(task)) for task in tasks]
    assert 0.2 < sum(chosen) / len(chosen) < 0.4
    again = HouseholdSuite(HouseholdSuite.Options(**options, searching_share=0.3), max_steps=suite.max_steps)
    assert chosen == [again.searches(again.spec(task)) for task in tasks]  # a fixed choice per task
    env = mixed.make()
    for task, searching in zip(tasks[:40], chosen[:40], strict=True):
        env.reset(task)
        assert mixed.expert_action(env) == next_command(mixed.spec(task), env.world(), searching=searching)
    for share, expected in ((0.0, False), (1.0, True)):
        edge = HouseholdSuite(HouseholdSuite.Options(**options, searching_share=share), max_steps=suite.max_steps)
        assert {edge.searches(edge.spec(task)) for task in edge.tasks("train")[:50]} == {expected}
