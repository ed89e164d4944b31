"""bench/failure_modes.py: a won episode is counted as won; a lost one is classified by what it took and
saw; the probes find the states where only wrong objects are in reach and where going back is on offer."""

from __future__ import annotations

from stages.envs.household import HouseholdSuite
from stages.envs.household.catalog import RECEPTACLE_KINDS
from stages.envs.household.expert import search_order
from stages.policy.torch_tiny import PromptFormat, WordTokenizer
from stages.policy.torch_tiny._pretrain import LabelledEpisode

from . import bench_module


def _bench():
    return bench_module("failure_modes")


def _task_with_only_wrong_objects_in_view(suite):
    """A task, an open-view receptacle of its search order holding only objects of other kinds, one of them,
    and an empty receptacle."""
    for task in suite.tasks("train"):
        spec = suite.spec(task)
        kinds = spec.layout.kinds
        empty = [i for i in range(len(kinds)) if not any(at == i for _, at in spec.objects) and i != spec.layout.lamp_at]
        for rec in search_order(spec):
            here = [name for name, at in spec.objects if at == rec]
            if (here and empty and rec != spec.layout.lamp_at and not RECEPTACLE_KINDS[kinds[rec]].openable
                    and all(name.split()[0] != spec.goal_kind for name in here)):
                return task, spec.layout.names[rec], here[0], spec.layout.names[empty[0]]
    raise AssertionError("no such task in the train split")


def test_a_won_episode_is_won_and_a_lost_one_says_it_took_a_wrong_object():
    bench, suite = _bench(), HouseholdSuite()
    task, place, wrong, _ = _task_with_only_wrong_objects_in_view(suite)
    expert = suite.expert(task)
    lost = (f"go to {place}", f"take {wrong} from {place}", "look")
    won, kinds, distinct = bench.classify(suite, [LabelledEpisode(task, True, len(expert), tuple(expert)), LabelledEpisode(task, False, 3, lost)])
    assert won == 1
    assert sum(kinds.values()) == 1 and next(iter(kinds)).endswith(", took a wrong one")
    assert distinct == [1]


def test_the_probes_find_the_take_wrong_and_the_go_back_states():
    bench, suite = _bench(), HouseholdSuite()
    task, place, wrong, empty = _task_with_only_wrong_objects_in_view(suite)
    fmt = PromptFormat(WordTokenizer.from_vocabulary(suite.vocabulary()))
    actions = (f"go to {place}", f"go to {empty}", f"go to {place}")
    take_wrong, go_back = bench.decisions(suite, fmt, [LabelledEpisode(task, False, 3, actions)])
    assert len(take_wrong) == 1  # at `place`: hands empty, only wrong objects in reach
    (state,) = take_wrong
    assert [fmt.tokenizer.decode(state.choices[i][:-1]) for i in state.bad] == [f"take {wrong} from {place}"]
    assert len(go_back) == 1  # at `empty`, going back to `place` was on offer (and taken)
    assert [fmt.tokenizer.decode(go_back[0].choices[i][:-1]) for i in go_back[0].bad] == [f"go to {place}"]


def _expert_after_take(suite, family):
    """A train task of `family`, its spec, and its expert's commands after the first take of a goal object."""
    for task in suite.tasks("train"):
        spec = suite.spec(task)
        if spec.family == family:
            actions = list(suite.expert(task))
            first = next(i for i, a in enumerate(actions) if a.startswith(f"take {spec.goal_kind} "))
            return spec, actions[first + 1 :]
    raise AssertionError(f"no {family} task in the train split")


def test_a_loss_after_taking_the_goal_object_names_the_first_goal_step_it_missed():
    bench, suite = _bench(), HouseholdSuite()
    spec, after = _expert_after_take(suite, "pick_clean_then_place")
    assert bench.after_take(spec, after) == "put it there, still lost"  # every step done: nothing missing
    assert bench.after_take(spec, [a for a in after if not a.startswith("clean ")]) == "never cleaned it"
    spec, after = _expert_after_take(suite, "pick_and_place")
    put = next(i for i, a in enumerate(after) if a.startswith("put "))
    assert bench.after_take(spec, after[:put]) == "at the target, never put it"
    assert bench.after_take(spec, []) == "never took it to the target"
    elsewhere = after[put].rsplit(" ", 2)[0] + " " + next(n for n in spec.layout.names if n != spec.layout.names[spec.target])
    assert bench.after_take(spec, [*after[:put], elsewhere]) == "put it elsewhere"
    spec, after = _expert_after_take(suite, "pick_two_obj_and_place")
    last_put = max(i for i, a in enumerate(after) if a.startswith("put "))
    assert bench.after_take(spec, after[:last_put]) == "put one of two there"
    spec, after = _expert_after_take(suite, "look_at_obj_in_light")
    assert bench.after_take(spec, [a for a in after if not a.startswith("use ")]) == "never used the lamp"
