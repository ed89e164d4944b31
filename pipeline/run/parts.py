"""The run's parts: one record, built once by the job (`job._run_parts`) and passed whole down the spine
(`grpo.run_grpo` -> `grpo._build`; back in the job, `job._finish`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gates.allocators import Allocator
from learner.trainer import Trainer
from pipeline.config import RunConfig
from pipeline.profiling import Profiler
from pipeline.progress import Progress
from pipeline.rundir import MetricsWriter
from pipeline.stage import Stage
from stages.envs.base import EnvSuite, Task
from stages.policy.base import Policy

from . import resume
from .heldout import Evaluate


@dataclass(frozen=True)
class RunParts:
    """What the GRPO phase runs on, and what the job reads back after it (restored from a checkpoint, if any)."""

    cfg: RunConfig
    run_dir: Path
    suite: EnvSuite
    policy: Policy
    tasks: Mapping[str, Task]
    """The train tasks GRPO draws prompts from, by id (`build.train_tasks`)."""
    allocator: Allocator
    trainer: Trainer
    profiler: Profiler
    metrics: MetricsWriter
    observers: Sequence[Stage] = ()
    """The custom stages of `[[stages]]` that run in this process (`build.observers`)."""
    progress: Progress | None = None
    checkpointer: resume.Checkpointer | None = None
    """Captures the state at every update boundary (None: nothing is captured)."""
    restore: Mapping[str, Any] | None = None
    """A checkpoint's `grpo` counters: a resumed run continues its counts."""
    evaluate: Evaluate | None = None
    """`evaluate(version, weights)`: the periodic held-out measure (`eval.every`); None: none."""
    heldout: dict[str, list[Task]] = field(default_factory=dict)
    """The held-out splits measured before and after GRPO (`heldout.heldout_tasks`)."""
