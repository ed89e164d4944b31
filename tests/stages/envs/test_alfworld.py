"""ALFWorld adapter: folder layout, task naming and the errors that say what to install or download."""

import importlib.util
import sys

import pytest

from stages.envs import build_suite
from stages.envs.alfworld import AlfWorldSuite, describe_task_folder, write_game

HAS_ALFWORLD = importlib.util.find_spec("alfworld") is not None


def _fake_data(root):
    """ALFWorld's folder layout with empty game files (enough for everything but playing)."""
    for split, folder in (("train", "pick_clean_then_place_in_recep-Mug-None-Cabinet-10"),
                          ("valid_seen", "look_at_obj_in_light-Book-None-DeskLamp-301"),
                          ("valid_unseen", "pick_two_obj_and_place-CellPhone-None-Sofa-212")):
        trial = root / split / folder / "trial_T20190907_000000_000000"
        trial.mkdir(parents=True)
        (trial / "game.tw-pddl").write_text("{}")
    return root


def test_task_folders_name_family_and_description():
    assert describe_task_folder("pick_clean_then_place_in_recep-Mug-None-Cabinet-10") == (
        "pick_clean_then_place", "put a clean mug in cabinet")
    assert describe_task_folder("look_at_obj_in_light-Book-None-DeskLamp-301") == (
        "look_at_obj_in_light", "look at book under the desklamp")
    with pytest.raises(ValueError, match="not an ALFWorld task folder"):
        describe_task_folder("trial_T2019")


def test_missing_data_says_how_to_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        build_suite("alfworld", {"data_dir": str(tmp_path / "json_2.1.1")}, max_steps=30)
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"no game\.tw-pddl files"):
        AlfWorldSuite(AlfWorldSuite.Options(data_dir=str(tmp_path / "empty")))


def test_missing_package_says_what_to_install(tmp_path, monkeypatch):
    # A None entry in sys.modules makes the import fail as if the package were not installed.
    monkeypatch.setitem(sys.modules, "alfworld.agents.environment.alfred_tw_env", None)
    with pytest.raises(ImportError, match=r"pip install 'rollcut\[alfworld\]'"):
        AlfWorldSuite(AlfWorldSuite.Options(data_dir=str(_fake_data(tmp_path))))


@pytest.mark.skipif(not HAS_ALFWORLD, reason="needs the alfworld extra")
def test_splits_map_to_alfworld_folders(tmp_path):
    suite = AlfWorldSuite(AlfWorldSuite.Options(data_dir=str(_fake_data(tmp_path))))
    (train,) = suite.tasks("train")
    assert train.task_id == "alfworld/train/pick_clean_then_place_in_recep-Mug-None-Cabinet-10/trial_T20190907_000000_000000"
    assert (train.family, train.description, train.features["scene"]) == ("pick_clean_then_place", "put a clean mug in cabinet", 10.0)
    assert [t.family for t in suite.tasks("heldout_seen")] == ["look_at_obj_in_light"]
    assert [t.family for t in suite.tasks("heldout_unseen")] == ["pick_two_obj_and_place"]


# A tiny single-room ALFWorld problem authored here (names mangled the way ALFWorld's demangler expects):
# a mug on countertop 1 must go into the closed cabinet 1.
_MUG = "Mug_bar__minus_00_dot_50_bar__plus_00_dot_90_bar__minus_01_dot_25"
_COUNTER = "CounterTop_bar__minus_01_dot_00_bar__plus_00_dot_95_bar__plus_00_dot_50"
_CABINET = "Cabinet_bar__minus_02_dot_00_bar__plus_00_dot_40_bar__plus_01_dot_00"
_COUNTER_AT, _CABINET_AT, _START = "loc_bar__minus_4_bar_2_bar_3_bar_45", "loc_bar__minus_8_bar_4_bar_2_bar_30", "loc_bar_0_bar_0_bar_0_bar_0"
TINY_PROBLEM = f"""(define (problem plan_trial_tiny)
(:domain alfred)
(:objects agent1 - agent {_MUG} - object {_COUNTER} - receptacle {_CABINET} - receptacle
  {_COUNTER_AT} - location {_CABINET_AT} - location {_START} - location
  MugType - otype CounterTopType - rtype CabinetType - rtype)
(:init (atLocation agent1 {_START})
  (receptacleAtLocation {_COUNTER} {_COUNTER_AT}) (receptacleAtLocation {_CABINET} {_CABINET_AT})
  (objectAtLocation {_MUG} {_COUNTER_AT}) (inReceptacle {_MUG} {_COUNTER})
  (receptacleType {_COUNTER} CounterTopType) (receptacleType {_CABINET} CabinetType)
  (objectType {_MUG} MugType) (openable {_CABINET}) (pickupable {_MUG})
  (canContain CabinetType MugType) (canContain CounterTopType MugType))
(:goal (exists (?r - receptacle) (exists (?o - object)
  (and (objectType ?o MugType) (receptacleType ?r CabinetType) (inReceptacle ?o ?r)))))
)
"""


@pytest.mark.skipif(not HAS_ALFWORLD, reason="needs the alfworld extra")
def test_an_authored_game_is_won_by_the_pddl_planner(tmp_path):
    folder = tmp_path / "train" / "pick_and_place_simple-Mug-None-Cabinet-1" / "trial_T0"
    write_game(folder / "game.tw-pddl", TINY_PROBLEM, "put a mug in cabinet")
    suite = AlfWorldSuite(AlfWorldSuite.Options(data_dir=str(tmp_path)), max_steps=10)
    (task,) = suite.tasks("train")
    plan = suite.expert(task)
    assert plan[0] == "go to countertop 1"
    env = suite.make()
    observation = env.reset(task)
    assert "Your task is to: put a mug in cabinet." in observation.text
    assert observation.admissible[:2] == ("go to cabinet 1", "go to countertop 1")
    for command in plan:
        assert command in observation.admissible
        result = env.step(command)
        observation = result.observation
    assert (result.won, result.done, result.reward) == (True, True, 1.0)
    env.close()
    vocabulary = set(suite.vocabulary())
    assert {word for command in plan for word in command.split()} <= vocabulary
