"""Typed run configuration: one frozen Struct per subsystem, decoded from TOML plus `--set` overrides.

`load_config` collects *every* problem (unknown keys, wrong types, out-of-range values, unknown plugin
names) before raising one `ConfigError`, so a user fixes a config in one go. Each component receives its
own section, never the root. The sections themselves are in `pipeline.config_sections` and `pipeline.config_learner` and
re-exported here: import them from `pipeline.config`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from .config_learner import EvalSection, LearnerSection, RangeSizes
from .config_placement import PlacementSection, RoleResources
from .config_sections import (
    AllocatorSection,
    EnvSection,
    GateSection,
    PolicySection,
    PretrainSection,
    ProfileSection,
    RolloutSection,
    RunSection,
    StageSpec,
    TransportSection,
    _Section,
)

__all__ = [
    "AllocatorSection",
    "ConfigError",
    "EnvSection",
    "EvalSection",
    "GateSection",
    "LearnerSection",
    "NameCheck",
    "PlacementSection",
    "PolicySection",
    "PretrainSection",
    "ProfileSection",
    "RangeSizes",
    "RoleResources",
    "RolloutSection",
    "RunConfig",
    "RunSection",
    "StageSpec",
    "TransportSection",
    "dump_toml",
    "load_config",
    "merge_overrides",
    "parse_override",
]


class RunConfig(_Section):
    run: RunSection = RunSection()
    env: EnvSection = EnvSection()
    policy: PolicySection = PolicySection()
    pretrain: PretrainSection = PretrainSection()
    rollout: RolloutSection = RolloutSection()
    gate: GateSection = GateSection()
    allocator: AllocatorSection = AllocatorSection()
    learner: LearnerSection = LearnerSection()
    eval: EvalSection = EvalSection()
    transport: TransportSection = TransportSection()
    placement: PlacementSection = PlacementSection()
    profile: ProfileSection = ProfileSection()
    stages: list[StageSpec] = []
    trackers: dict[str, dict[str, Any]] = {}
    """Each tracker's options, `[trackers.<name>]` (the tracker is chosen by `run.trackers`)."""


class ConfigError(Exception):
    """A configuration with one or more problems; `problems` lists each one."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


# --------------------------------------------------------------------------------------------------
# Loading


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], value); the value is read as TOML, else kept as a bare string."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError([f"--set {item!r}: expected section.key=value"])
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return [part.strip() for part in key.split(".")], value


def merge_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError([f"--set {item!r}: {part!r} is not a section"])
        node[path[-1]] = value
    return data


def _struct_problems(data: Any, cls: type[msgspec.Struct], where: str) -> tuple[list[str], dict[str, Any]]:
    """Every unknown key and mistyped value in `data` against `cls`, recursing into sub-sections.

    Returns the problems and the data with every offending key removed, so the remaining values can
    still be range-checked and all problems reported together.
    """
    if not isinstance(data, Mapping):
        return [f"{where or 'config'}: expected a table, got {type(data).__name__}"], {}
    problems: list[str] = []
    clean: dict[str, Any] = {}
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            problems.append(f"{path}: unknown key (known: {', '.join(sorted(fields))})")
            continue
        ftype = fields[key].type
        if isinstance(ftype, type) and issubclass(ftype, msgspec.Struct):
            sub_problems, clean[key] = _struct_problems(value, ftype, path)
            problems += sub_problems
            continue
        try:
            msgspec.convert(value, ftype, strict=False)
        except msgspec.ValidationError as exc:
            problems.append(f"{path}: {exc}")
            continue
        clean[key] = value
    return problems, clean


def _range_problems(cfg: RunConfig) -> list[str]:
    """Every section's own range checks, then the checks that span sections."""
    problems = [p for name in cfg.__struct_fields__ if name not in ("stages", "trackers") for p in getattr(cfg, name).problems()]
    if cfg.run.target_heldout and not (cfg.eval.every > 0 and cfg.eval.periodic_tasks() > 0):
        problems.append("run.target_heldout needs eval.every > 0 and eval.tasks (or eval.curve_tasks) > 0 (held-out "
                        f"success is measured then, on the {cfg.eval.curve_range} range)")
    if cfg.eval.curve_off_clock and not (cfg.run.keep_weights_every > 0 and cfg.eval.periodic_tasks() > 0):
        problems.append("eval.curve_off_clock needs run.keep_weights_every > 0 (the versions it measures) and eval.tasks "
                        f"(or eval.curve_tasks) > 0 (the tasks of the {cfg.eval.curve_range} range it measures them on)")
    problems += [f"stages[{i}].process = true needs transport.mode = \"processes\" (a stage process reaches the run's "
                 "events over ipc or tcp, not inproc)" for i, spec in enumerate(cfg.stages)
                 if spec.process and cfg.transport.mode != "processes"]
    return problems


NameCheck = Callable[[RunConfig], list[str]]


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    *,
    extra_checks: Iterable[NameCheck] = (),
) -> RunConfig:
    """Read TOML (optional), apply overrides, validate everything, return the frozen config.

    Raises:
        ConfigError: listing every problem found.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError([f"{path}: no such config file"]) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    data = merge_overrides(data, overrides)
    problems, clean = _struct_problems(data, RunConfig, "")
    cfg = msgspec.convert(clean, RunConfig, strict=False)
    problems += _range_problems(cfg)
    for check in extra_checks:
        problems += check(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def dump_toml(cfg: RunConfig) -> str:
    """The resolved config as TOML (written into the run folder)."""
    return _to_toml(msgspec.to_builtins(cfg))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _to_toml(data: dict[str, Any]) -> str:
    lines: list[str] = []
    for section, body in data.items():
        if isinstance(body, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in body.items() if v is not None]  # None: key left out
            lines.append("")
        elif isinstance(body, list) and body and all(isinstance(b, dict) for b in body):
            for item in body:
                lines.append(f"[[{section}]]")
                lines += [f"{k} = {_toml_value(v)}" for k, v in item.items()]
                lines.append("")
        else:
            lines.insert(0, f"{section} = {_toml_value(body)}")
    return "\n".join(lines)
