"""Environments: the built-in household suite and adapters, all registered in `ENVS`.

A suite class is constructed as `Suite(max_steps=..., **env.options)`.
"""

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

__all__ = ["ENVS", "SPLITS", "EnvSuite", "Environment", "Observation", "StepResult", "Task"]
