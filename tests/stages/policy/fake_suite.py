"""A tiny deterministic `EnvSuite` for policy tests: find an object and take it.

The first observation says where the object is ("the key is on shelf 2"); objects are mostly at
their home place, so a small model learns the task in seconds, and held-out unseen tasks ask for an
object never asked for in training.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from stages.envs.base import Observation, StepResult, Task

PLACES = ("table 1", "table 2", "shelf 1", "shelf 2", "drawer 1")
SEEN = ("apple", "book", "key", "cup")
UNSEEN = ("pen",)
OBJECTS = SEEN + UNSEEN


def _layout(task: Task) -> dict[str, str]:
    """object -> place: each object has a home place; one random object per task is elsewhere."""
    layout = {obj: PLACES[i % len(PLACES)] for i, obj in enumerate(OBJECTS)}
    rng = random.Random(task.task_id)
    layout[rng.choice(OBJECTS)] = rng.choice(PLACES)
    return layout


class FindEnv:
    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def reset(self, task: Task) -> Observation:
        self.task = task
        self.target = task.description.removeprefix("take the ")
        self.layout = _layout(task)
        self.at: str | None = None
        self.steps = 0
        hint = f"the {self.target} is on {self.layout[self.target]}."
        return Observation(f"you are in a room. {hint}", self._admissible())

    def _admissible(self) -> tuple[str, ...]:
        cmds = ["look", *(f"go to {p}" for p in PLACES)]
        if self.at is not None:
            cmds += [f"take {o} from {self.at}" for o, p in self.layout.items() if p == self.at]
        return tuple(cmds)

    def step(self, action: str) -> StepResult:
        self.steps += 1
        won = False
        if action.startswith("go to ") and action[6:] in PLACES:
            self.at = action[6:]
            here = [o for o, p in self.layout.items() if p == self.at]
            text = f"you arrive at {self.at}. you see " + (", ".join(here) if here else "nothing") + "."
        elif action == f"take {self.target} from {self.at}" and action in self._admissible():
            won = True
            text = f"you take the {self.target}."
        else:
            text = "nothing happens."
        done = won or self.steps >= self.max_steps
        return StepResult(Observation(text, self._admissible()), float(won), done, won)

    def close(self) -> None:
        pass


class FindSuite:
    name = "find"

    def __init__(self, max_steps: int = 4, per_split: int = 40) -> None:
        self.max_steps = max_steps
        self.per_split = per_split

    def tasks(self, split: str) -> Sequence[Task]:
        objects = UNSEEN if split == "heldout_unseen" else SEEN
        return [
            Task(f"find/{split}/{i:04d}", "find", f"take the {objects[i % len(objects)]}", split)
            for i in range(self.per_split)
        ]

    def make(self) -> FindEnv:
        return FindEnv(self.max_steps)

    def expert(self, task: Task) -> list[str]:
        target = task.description.removeprefix("take the ")
        place = _layout(task)[target]
        return [f"go to {place}", f"take {target} from {place}"]

    def vocabulary(self) -> Iterable[str]:
        return [
            "you are in a room the is on arrive at see nothing take from happens go to look",
            *PLACES,
            *OBJECTS,
        ]


class RecoveringFindSuite(FindSuite):
    """`FindSuite` whose expert also acts from any state (`stages.envs.base.RecoveringExpert`)."""

    def expert_action(self, env: FindEnv) -> str:
        place = env.layout[env.target]
        return f"take {env.target} from {place}" if env.at == place else f"go to {place}"
