"""Every problem of a config at once: names that do not resolve, plugin options that do not decode, and what
only building finds (`run.py check`, and the start of every run: exit 2 with the list).

`load(path, overrides)` is `pipeline.config.load_config` with these checks added.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gates import GATES, check_gate
from gates.allocators import check_allocator
from learner.aggregation import AGGREGATIONS
from learner.losses import LOSSES
from learner.schedules import LR_SCHEDULES
from pipeline.config import ConfigError, RunConfig, load_config
from pipeline.plugins import option_problems
from pipeline.stage import STAGES, build_stage
from pipeline.task_ranges import FINAL
from pipeline.trackers import tracker_problems
from pipeline.verdict import load_verdict
from stages import envs
from stages.policy import check_backend

from . import build
from .build import train_tasks


def name_checks(cfg: RunConfig) -> list[str]:
    """Every configured name that does not resolve and every bad plugin option (env, policy, gate, allocator,
    stages), for `load_config(extra_checks=...)`; `build_checks` then builds what it can once all are fine."""
    problems = envs.check_suite(cfg.env.name, cfg.env.options)
    problems += check_backend(cfg.policy)
    gate_problems = GATES.check(cfg.gate.name, "gate.name")
    if not gate_problems and cfg.gate.enabled and not cfg.gate.problems():  # (a bad gate.k / gate.tau is listed)
        gate_problems = _gate_problems(cfg)
    problems += gate_problems
    problems += LOSSES.check(cfg.learner.loss, "learner.loss")
    problems += AGGREGATIONS.check(cfg.learner.aggregation, "learner.aggregation")
    problems += LR_SCHEDULES.check(cfg.learner.lr_schedule, "learner.lr_schedule")
    problems += tracker_problems(cfg.run.trackers, cfg.trackers)
    problems += final_range_problems(cfg)
    problems += [f"allocator: {p}" for p in check_allocator(cfg.allocator.name, cfg.allocator.options)]
    for i, spec in enumerate(cfg.stages):
        stage_problems = STAGES.check(spec.target, f"stages[{i}].target")
        problems += stage_problems or option_problems(
            STAGES.get(spec.target), spec.options, f"stages[{i}].options", f"stage {spec.target!r}"
        )
    return problems + (build_checks(cfg) if not problems else [])


VERDICTS = Path(__file__).resolve().parents[2] / "configs" / "verdicts"
"""The declared verdicts of this source tree."""


def final_range_problems(cfg: RunConfig, verdicts: Path = VERDICTS) -> list[str]:
    """A run that reads the final range must name (`eval.verdict`) a declared verdict file that reads it
    (`pipeline/task_ranges.py`: the config check asks for the name, this for the file)."""
    if cfg.eval.range != FINAL or not cfg.eval.verdict:
        return []
    try:
        verdict = load_verdict(verdicts / f"{cfg.eval.verdict}.toml")
    except ConfigError as exc:
        return [f"eval.verdict = {cfg.eval.verdict!r}: {problem}" for problem in exc.problems]
    if verdict.range != FINAL:
        return [f"eval.verdict = {cfg.eval.verdict!r}: that verdict reads range {verdict.range!r}, not {FINAL!r}"]
    return []


_BUILD_ERRORS = (TypeError, ValueError, LookupError, OSError, ImportError)


def build_checks(cfg: RunConfig) -> list[str]:
    """Build the environment suite, the allocator (against the suite's train tasks) and the custom stages
    (cheap constructors, no warm start) so what only building finds (a missing games folder, a check across
    options, any exception a plugin's constructor raises) fails `run.py check` and the start of `run.py` with
    exit 2 and one line naming the part, not a traceback after the warm start. (The gate is built by
    `_gate_problems`.)"""
    problems: list[str] = []

    def attempt(where: str, make: Any) -> Any:
        try:
            return make()
        except Exception as exc:  # a plugin's constructor is user code: whatever it raises is a config problem
            kind = "" if isinstance(exc, _BUILD_ERRORS) else f"{type(exc).__name__}: "
            problems.append(f"{where}: {kind}{' '.join(str(exc).split())}")
            return None

    suite = attempt("env", lambda: build.suite(cfg))
    if suite is not None:
        train = attempt("env", lambda: train_tasks(cfg, suite))
        if train is not None:
            attempt(f"allocator {cfg.allocator.name!r}", lambda: build.allocator(cfg, train))
    for i, spec in enumerate(cfg.stages):
        attempt(f"stages[{i}]", lambda i=i, spec=spec: build_stage(spec.target, spec.options, f"stages[{i}].options"))
    return problems


def _gate_problems(cfg: RunConfig) -> list[str]:
    """The gate's options decoded into its `Options` and the gate built; its first checkpoint must be reachable."""
    problems = check_gate(cfg.gate.name, cfg.gate.gate_options())
    if problems:
        return problems
    try:
        gate = build.gate(cfg)
    except Exception as exc:  # the gate's constructor is user code (see build_checks)
        kind = "" if isinstance(exc, _BUILD_ERRORS) else f"{type(exc).__name__}: "
        return [f"gate.options: {kind}{' '.join(str(exc).split())}"]
    first = min(getattr(gate, "checkpoints", None) or [0])
    if first > cfg.env.max_steps:
        return [f"gate.k ({first}) is beyond env.max_steps ({cfg.env.max_steps}): the gate could never fire"]
    return []


def load(path: str | Path | None, overrides: Sequence[str]) -> RunConfig:
    return load_config(path, overrides, extra_checks=[name_checks])
