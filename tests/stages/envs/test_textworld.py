"""TextWorld adapter: a game made offline with tw-make and played to a win with its walkthrough."""

import re
import time

import pytest

from stages.envs import build_suite
from stages.envs.textworld import TextWorldSuite, clean_feedback, find_games

_STATUS = re.compile(r"score:|moves:|=-\s*-?\d+/\d+", re.IGNORECASE)

pytestmark = [
    pytest.mark.textworld,
    pytest.mark.filterwarnings("ignore:Unable to find valid actions"),  # jericho, harmless for tw-make games
]


@pytest.fixture(scope="module")
def games_dir(tmp_path_factory):
    pytest.importorskip("textworld")
    from stages.envs.textworld import generate_games

    folder = tmp_path_factory.mktemp("textworld")
    start = time.perf_counter()
    generate_games(folder / "train", 1, seed=7, world_size=3, nb_objects=4, quest_length=3)
    print(f"tw-make: {time.perf_counter() - start:.1f} s for one game")
    return folder


def test_a_generated_game_is_won_by_its_walkthrough(games_dir):
    suite = build_suite("textworld", {"games_dir": str(games_dir)}, max_steps=30)
    (task,) = suite.tasks("train")
    assert task.task_id == "textworld/train/tw-000007"
    assert task.description
    assert [suite.tasks("heldout_seen"), suite.tasks("heldout_unseen")] == [[], []]
    plan = suite.expert(task)
    assert len(plan) == task.features["expert_steps"] >= 1
    env = suite.make()
    observation = env.reset(task)
    assert "$$" not in observation.text
    for command in plan:
        assert not _STATUS.search(observation.text), observation.text  # no room/score/moves status line
        assert command in observation.admissible, (command, observation.admissible)
        result = env.step(command)
        observation = result.observation
    assert (result.won, result.done, result.reward) == (True, True, 1.0)
    # A second episode of the same game starts over.
    assert env.reset(task).admissible
    assert not env.step("look").done
    env.close()


def test_step_limit_and_vocabulary(games_dir):
    suite = TextWorldSuite(TextWorldSuite.Options(games_dir=str(games_dir)), max_steps=2)
    (task,) = suite.tasks("train")
    env = suite.make()
    env.reset(task)
    assert [env.step("look").done for _ in range(2)] == [False, True]
    with pytest.raises(RuntimeError):
        env.step("look")
    env.close()
    vocabulary = set(suite.vocabulary())
    assert {word for command in suite.expert(task) for word in command.split()} <= vocabulary


def test_missing_folder_and_json_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TextWorldSuite(TextWorldSuite.Options(games_dir=str(tmp_path / "nowhere")))
    (tmp_path / "lonely.z8").write_bytes(b"")
    suite = TextWorldSuite(TextWorldSuite.Options(games_dir=str(tmp_path), heldout_seen_share=0.0))
    with pytest.raises(FileNotFoundError, match="lonely.json is missing"):
        suite.tasks("train")


def test_flat_folders_split_by_a_stable_hash(tmp_path):
    for i in range(40):
        (tmp_path / f"game{i}.z8").write_bytes(b"")
    first, second = find_games(tmp_path), find_games(tmp_path)
    assert first == second
    assert not set(first["train"]) & set(first["heldout_seen"])
    assert len(first["train"]) + len(first["heldout_seen"]) == 40
    assert 0 < len(first["heldout_seen"]) < 20
    assert first["heldout_unseen"] == []


def test_banner_is_removed():
    banner = "\n\n   ________  ___\n  |        \\|  \\\n   \\$$$$$$$$| $$\n\n\nWelcome!\n\n\n-= Kitchen =-\nA room."
    assert clean_feedback(banner) == "Welcome!\n\n-= Kitchen =-\nA room."


def test_status_lines_are_stripped():
    feedback = "Kitchen                          Score: 0   Moves: 3\n-= Kitchen =-0/3\nA room.\nMoves: 12"
    assert clean_feedback(feedback) == "-= Kitchen =-\nA room."
    assert clean_feedback("You moved 3 boxes.") == "You moved 3 boxes."


def test_an_empty_split_is_warned_about_with_how_to_make_split_folders(tmp_path):
    from structlog.testing import capture_logs

    (tmp_path / "only.z8").write_bytes(b"")
    with capture_logs() as logs:
        TextWorldSuite(TextWorldSuite.Options(games_dir=str(tmp_path), heldout_seen_share=0.0))
    (warning,) = [e for e in logs if e["event"] == "textworld.empty_split"]
    assert warning["empty"] == ["heldout_seen", "heldout_unseen"] and "heldout_unseen" in warning["hint"]
