"""The environment contract: a suite of tasks (with splits and an expert) and episodes over them.

An `EnvSuite` is what the config names (`env.name`); it enumerates tasks per split, makes fresh
`Environment` episodes and gives the expert plan for a task. Suites are registered in `stages.envs.ENVS`
exactly like a user's plugin (`rollcut.envs` entry points or `module:Class`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pipeline.contracts import Task as Task  # re-exported: the contract lives in the mechanism layer

SPLITS = ("train", "heldout_seen", "heldout_unseen")


@dataclass(frozen=True, slots=True)
class Observation:
    text: str
    admissible: tuple[str, ...]
    """Commands that are valid now, spelled exactly as the environment accepts them."""


@dataclass(frozen=True, slots=True)
class StepResult:
    observation: Observation
    reward: float
    done: bool
    won: bool
    info: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One episode at a time; `reset` starts a new one. Not thread-safe; one per trajectory."""

    def reset(self, task: Task) -> Observation: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


@runtime_checkable
class EnvSuite(Protocol):
    """A registered family of environments: tasks per split, episodes, and an expert."""

    name: str
    max_steps: int

    def tasks(self, split: str) -> Sequence[Task]: ...

    def make(self) -> Environment: ...

    def expert(self, task: Task) -> list[str]:
        """A plan that solves `task` from its initial state (replayable step by step)."""
        ...

    def vocabulary(self) -> Iterable[str]:
        """Every word that can appear in task texts, observations and commands (for tokenizers)."""
        ...


@runtime_checkable
class RecoveringExpert(Protocol):
    """An `EnvSuite` whose expert can act from *any* state of an episode, not only along its own plan:
    what DAgger and noise-injected demonstrations need to label the states a learner reaches."""

    def expert_action(self, env: Environment) -> str:
        """The expert's next command in `env`'s current episode (an env made by this suite)."""
        ...
