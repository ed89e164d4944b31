"""GameEpisode (shared by the TextWorld and ALFWorld adapters) on a scripted stand-in for a textworld env."""

from pathlib import Path

import pytest

from stages.envs._game_episode import GameEpisode
from stages.envs.base import Task


class _State(dict):
    def __init__(self, feedback: str, won: bool = False, lost: bool = False):
        super().__init__(admissible_commands=["go north", "win"], won=won, lost=lost)
        self.feedback = feedback


class _Game:
    """A game that is won by the command `win` and never ends otherwise."""

    def __init__(self, path: Path, started: list[Path]):
        started.append(path)
        self.closed = False

    def reset(self):
        return _State("  You are in a room.  ")

    def step(self, command):
        won = command == "win"
        return _State(f"You {command}.", won=won), float(won), won

    def close(self):
        self.closed = True


def _episode(max_steps=3, **kwargs):
    started: list[Path] = []
    games = {"a": Path("a.z8"), "b": Path("b.z8")}
    episode = GameEpisode(game_file=lambda task: games[task.task_id], start=lambda path: _Game(path, started),
                          max_steps=max_steps, **kwargs)
    return episode, started


def _task(task_id):
    return Task(task_id, "textworld", "win the game", "train", {})


def test_the_interpreter_restarts_only_when_the_game_changes():
    episode, started = _episode()
    assert episode.reset(_task("a")).text == "You are in a room."
    episode.reset(_task("a"))
    episode.reset(_task("b"))
    assert started == [Path("a.z8"), Path("b.z8")]


def test_a_win_ends_the_episode_with_reward_one_and_no_commands():
    episode, _ = _episode(extra_info=lambda state: {"lost": state["lost"]})
    observation = episode.reset(_task("a"))
    assert observation.admissible == ("go north", "win")
    result = episode.step("win")
    assert (result.reward, result.done, result.won, result.observation.admissible) == (1.0, True, True, ())
    assert result.info == {"steps": 1, "truncated": False, "lost": False}
    with pytest.raises(RuntimeError, match="episode is over"):
        episode.step("go north")


def test_the_step_limit_truncates_and_a_win_on_the_last_step_is_not_truncation():
    episode, _ = _episode(max_steps=2)
    episode.reset(_task("a"))
    assert not episode.step("go north").done
    last = episode.step("go north")
    assert (last.done, last.won, last.info["truncated"]) == (True, False, True)
    episode.reset(_task("a"))
    episode.step("go north")
    won = episode.step("win")
    assert (won.done, won.won, won.info["truncated"]) == (True, True, False)


def test_close_closes_the_game_and_forgets_it():
    episode, started = _episode()
    episode.reset(_task("a"))
    episode.close()
    with pytest.raises(RuntimeError):
        episode.step("win")
    episode.reset(_task("a"))
    assert started == [Path("a.z8"), Path("a.z8")]
