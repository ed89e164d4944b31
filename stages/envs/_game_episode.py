"""One episode at a time of a game played through `textworld.start`: the part the TextWorld and ALFWorld
adapters share.

An adapter says how to find a task's game file, how to start a game (which `EnvInfos`, which wrappers)
and how to turn the game's feedback into observation text; this class keeps the interpreter of the
current game (switching to another task's game restarts it), counts steps, ends the episode on a win,
the game's own end or the step limit, and lists the admissible commands while the episode runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .base import Observation, StepResult, Task


class GameEpisode:
    def __init__(
        self,
        *,
        game_file: Callable[[Task], Path],
        start: Callable[[Path], Any],
        max_steps: int,
        text: Callable[[str], str] = str.strip,
        extra_info: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self._game_file = game_file
        self._start = start
        self._max_steps = max_steps
        self._text = text
        self._extra_info = extra_info
        self._env: Any = None
        self._game: Path | None = None
        self._steps = 0
        self._done = True

    def reset(self, task: Task) -> Observation:
        game = self._game_file(task)
        if game != self._game:
            self.close()
            self._env = self._start(game)
            self._game = game
        state = self._env.reset()
        self._steps = 0
        self._done = False
        return Observation(self._text(state.feedback), tuple(state["admissible_commands"] or ()))

    def step(self, action: str) -> StepResult:
        if self._done or self._env is None:
            raise RuntimeError("the episode is over; call reset() first")
        state, _score, game_over = self._env.step(action)
        self._steps += 1
        won = bool(state["won"])
        truncated = not (game_over or won) and self._steps >= self._max_steps
        self._done = bool(game_over) or won or truncated
        admissible = () if self._done else tuple(state["admissible_commands"] or ())
        info = {"steps": self._steps, "truncated": truncated}
        if self._extra_info is not None:
            info |= self._extra_info(state)
        return StepResult(Observation(self._text(state.feedback), admissible), float(won), self._done, won, info)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
        self._env = None
        self._game = None
        self._done = True
