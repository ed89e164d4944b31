"""Environments: the built-in household suite and adapters, all registered in `ENVS`.

A suite class follows the plugin convention (`pipeline.plugins`): `[env.options]` is decoded strictly into
its `Options` Struct and it is constructed as `Suite(options, max_steps=env.max_steps)` (`build_suite`).
"""

from collections.abc import Mapping
from typing import Any

from pipeline.plugins import build_plugin, option_problems
from pipeline.registry import Registry

from .base import SPLITS as SPLITS
from .base import Environment as Environment
from .base import EnvSuite as EnvSuite
from .base import Observation as Observation
from .base import StepResult as StepResult
from .base import Task as Task

ENVS = Registry(
    "envs",
    {
        "household": "stages.envs.household:HouseholdSuite",
        "textworld": "stages.envs.textworld:TextWorldSuite",
        "alfworld": "stages.envs.alfworld:AlfWorldSuite",
    },
)



def check_suite(name: str, options: Mapping[str, Any]) -> list[str]:
    """Every problem of `[env.options]` for suite `name` (unknown, mistyped, out of range), listed at once."""
    try:
        cls = ENVS.get(name)
    except LookupError as exc:
        return [f"env.name: {exc}"]
    return option_problems(cls, options, "env.options", f"env {name!r}")


def build_suite(name: str, options: Mapping[str, Any], *, max_steps: int) -> EnvSuite:
    """The suite `name` (registered or `module:Class`) built from its options table.

    Raises:
        LookupError: an unknown suite. ValueError: invalid options (every problem listed), or what the suite
            itself refuses; OSError: e.g. a missing games folder.
    """
    return build_plugin(ENVS.get(name), options, "env.options", f"env {name!r}", max_steps=max_steps)


__all__ = ["ENVS", "build_suite", "check_suite", "SPLITS", "EnvSuite", "Environment", "Observation", "StepResult", "Task"]
