import random

import pytest

from stages.envs.household import HouseholdEnv, HouseholdSuite
from stages.envs.household.catalog import FAMILIES
from stages.envs.household.grammar import Command, format_command, parse_command

from .conftest import first_task

NOTHING = "Nothing happens."


def test_reset_describes_the_room_and_states_the_task(suite):
    task = suite.tasks("train")[0]
    observation = suite.make().reset(task)
    assert observation.text.startswith("You are in the middle of the ")
    assert observation.text.endswith(f"Your task is to: {task.description}.")
    layout = suite.spec(task).layout
    assert observation.admissible == tuple(f"go to {name}" for name in layout.names) + ("inventory", "look")


def test_invalid_commands_do_nothing_but_count_as_steps(suite):
    env = suite.make()
    start = env.reset(suite.tasks("train")[0])
    for step, action in enumerate(["dance", "take mug 1 from cabinet 1", "open countertop 1", "go to moon 1"], 1):
        result = env.step(action)
        assert result.observation.text == NOTHING
        assert result.info == {"valid": False, "steps": step, "truncated": False}
        assert result.observation.admissible == start.admissible
        assert (result.reward, result.done, result.won) == (0.0, False, False)


def test_closed_receptacles_hide_their_contents_until_opened(suite):
    task = first_task(suite, family="pick_and_place", goal_hidden=1.0)
    spec = suite.spec(task)
    name, rec = next((n, r) for n, r in spec.objects if n.startswith(spec.goal_kind + " "))
    receptacle = spec.layout.names[rec]
    env = suite.make()
    env.reset(task)
    arrival = env.step(f"go to {receptacle}").observation
    assert arrival.text == f"You arrive at {receptacle}. The {receptacle} is closed."
    assert f"open {receptacle}" in arrival.admissible
    assert not any(command.startswith("take ") for command in arrival.admissible)
    assert env.step(f"take {name} from {receptacle}").observation.text == NOTHING
    opened = env.step(f"open {receptacle}").observation
    assert opened.text.startswith(f"You open the {receptacle}. The {receptacle} is open. In it, you see ")
    assert f"a {name}" in opened.text
    assert f"take {name} from {receptacle}" in opened.admissible
    assert f"close {receptacle}" in opened.admissible
    assert env.step(f"take {name} from {receptacle}").observation.text == f"You pick up the {name} from the {receptacle}."
    assert env.step(f"close {receptacle}").observation.text == f"You close the {receptacle}."
    assert env.step("inventory").observation.text == f"You are carrying: a {name}."


def test_step_limit_ends_the_episode_without_a_win(suite):
    env = HouseholdSuite(HouseholdSuite.Options(train_size=5), max_steps=3).make()
    env.reset(suite.tasks("train")[0])
    results = [env.step("look") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True]
    assert (results[-1].won, results[-1].reward) == (False, 0.0)
    assert results[-1].info["truncated"] is True
    assert results[-1].observation.admissible == ()
    with pytest.raises(RuntimeError):
        env.step("look")


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_wins_every_family_only_on_its_last_command(suite, family):
    for split in ("train", "heldout_unseen"):
        task = first_task(suite, split, family=family)
        env = suite.make()
        env.reset(task)
        plan = suite.expert(task)
        results = [env.step(command) for command in plan]
        assert all(result.info["valid"] for result in results)
        assert [result.won for result in results] == [False] * (len(plan) - 1) + [True]
        assert (results[-1].reward, results[-1].done) == (1.0, True)


@pytest.mark.parametrize(("family", "skipped"), [("pick_clean_then_place", "clean "), ("pick_heat_then_place", "heat "),
                                                 ("pick_cool_then_place", "cool ")])
def test_placing_an_untreated_object_does_not_win(suite, family, skipped):
    task = first_task(suite, family=family)
    env = suite.make()
    env.reset(task)
    results = [env.step(command) for command in suite.expert(task) if not command.startswith(skipped)]
    assert all(result.info["valid"] for result in results)
    assert not any(result.won for result in results)


def test_the_lamp_may_be_lit_before_the_object_is_fetched(suite):
    task = first_task(suite, family="look_at_obj_in_light")
    spec = suite.spec(task)
    plan = suite.expert(task)
    env = suite.make()
    env.reset(task)
    lamp_place = spec.layout.names[spec.layout.lamp_at]
    assert env.step(f"go to {lamp_place}").info["valid"]
    assert env.step("use desklamp 1").observation.text == "You turn on the desklamp 1."
    results = [env.step(command) for command in plan[:-1]]  # everything but the final "use desklamp 1"
    assert [result.won for result in results] == [False] * (len(results) - 1) + [True]


def test_transforms_change_what_examine_says(suite):
    task = first_task(suite, family="pick_heat_then_place")
    spec = suite.spec(task)
    env = suite.make()
    env.reset(task)
    plan = suite.expert(task)
    heat = next(command for command in plan if command.startswith("heat "))
    for command in plan[: plan.index(heat) + 1]:
        env.step(command)
    obj = parse_command(heat).first
    assert env.step(f"examine {obj}").observation.text == f"This is a hot {obj}."
    fridge = spec.layout.names[spec.layout.kinds.index("fridge")]
    env.step(f"go to {fridge}")
    assert env.step(f"cool {obj} with {fridge}").observation.text == f"You cool the {obj} using the {fridge}."
    assert env.step(f"examine {obj}").observation.text == f"This is a cool {obj}."


def _replay(suite, task, history):
    env = suite.make()
    env.max_steps = 10**9  # probes may take many steps
    env.reset(task)
    for command in history:
        env.step(command)
    return env


def test_every_admissible_command_is_accepted(suite):
    rng = random.Random(7)
    for task in suite.tasks("train")[:12]:
        env = suite.make()
        observation = env.reset(task)
        history: list[str] = []
        for _ in range(8):
            for command in observation.admissible:
                assert _replay(suite, task, history).step(command).info["valid"], (task.task_id, history, command)
            action = rng.choice(observation.admissible)
            result = env.step(action)
            if result.done:
                break
            history.append(action)
            observation = result.observation


def _all_commands(spec) -> list[str]:
    """Every canonical command over the task's names, possible now or not."""
    objects = [name for name, _ in spec.objects] + ["desklamp 1"]
    receptacles = list(spec.layout.names)
    commands = [Command("look"), Command("inventory")]
    for rec in receptacles:
        commands += [Command(verb, rec) for verb in ("go", "open", "close", "examine")]
        for obj in objects:
            commands += [Command(verb, obj, rec) for verb in ("take", "clean", "heat", "cool")]
            commands += [Command("put", obj, rec, preposition) for preposition in ("in", "on")]
    commands += [Command(verb, obj) for obj in objects for verb in ("use", "examine")]
    return [format_command(command) for command in commands]


def test_commands_that_are_not_admissible_do_nothing(suite):
    rng = random.Random(3)
    for task in (first_task(suite, family=family) for family in FAMILIES):
        spec = suite.spec(task)
        env = suite.make()
        observation = env.reset(task)
        history: list[str] = []
        for _ in range(3):
            probe = _replay(suite, task, history)
            for command in _all_commands(spec):
                if command not in observation.admissible:
                    result = probe.step(command)
                    assert result.observation.text == NOTHING, (history, command)
                    assert result.observation.admissible == observation.admissible
            plan = suite.expert(task)
            action = plan[len(history)] if len(history) < len(plan) - 1 else rng.choice(observation.admissible)
            history.append(action)
            observation = env.step(action).observation


def test_admissible_commands_change_the_state_they_name(suite):
    rng = random.Random(11)
    env = suite.make()
    env.max_steps = 10**9  # the checks below take extra steps
    for task in suite.tasks("heldout_seen")[:40]:
        observation = env.reset(task)
        for _ in range(30):
            action = rng.choice(observation.admissible)
            result = env.step(action)
            if result.done:
                assert result.won
                break
            text, admissible = result.observation.text, result.observation.admissible
            command = parse_command(action)
            if command.verb == "go":
                assert text.startswith(f"You arrive at {command.first}. ")
                assert f"go to {command.first}" not in admissible
            elif command.verb == "take":
                assert f"examine {command.first}" in admissible
                assert not any(a.startswith("take ") for a in admissible)
                assert env.step("inventory").observation.text == f"You are carrying: a {command.first}."
            elif command.verb == "put":
                assert f"a {command.first}" in env.step(f"examine {command.second}").observation.text
            elif command.verb == "open":
                assert f"close {command.first}" in admissible
            elif command.verb == "close":
                assert f"open {command.first}" in admissible
            observation = result.observation  # inventory and examine leave the admissible list as it was


def test_an_env_built_directly_from_a_spec_matches_the_suite(suite):
    task = suite.tasks("train")[3]
    direct = HouseholdEnv(resolve=None)
    assert direct.reset_spec(suite.spec(task)).admissible == suite.make().reset(task).admissible


def test_the_world_records_where_the_agent_has_been_and_what_it_has_seen_inside(suite):
    from stages.envs.household.catalog import RECEPTACLE_KINDS

    task = next(t for t in suite.tasks("train") if any(RECEPTACLE_KINDS[k].openable for k in suite.spec(t).layout.kinds))
    layout = suite.spec(task).layout
    closed = next(i for i, kind in enumerate(layout.kinds) if RECEPTACLE_KINDS[kind].openable)
    surface = next(i for i, kind in enumerate(layout.kinds) if not RECEPTACLE_KINDS[kind].openable)
    env = suite.make()
    env.reset(task)
    assert not any(env.world().visited) and not any(env.world().looked)
    env.step(f"go to {layout.names[surface]}")
    assert env.world().visited[surface] and env.world().looked[surface]  # open-view: seen on arrival
    env.step(f"go to {layout.names[closed]}")
    assert env.world().visited[closed] and not env.world().looked[closed]  # a closed door hides it
    env.step(f"open {layout.names[closed]}")
    assert env.world().looked[closed]
    env.step(f"close {layout.names[closed]}")
    assert env.world().looked[closed]  # seen once stays seen
