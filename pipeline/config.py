"""Typed run configuration: one frozen Struct per subsystem, decoded from TOML plus `--set` overrides.

`load_config` collects *every* problem (unknown keys, wrong types, out-of-range values, unknown plugin
names) before raising one `ConfigError`, so a user fixes a config in one go. Each component receives its
own section, never the root.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec


class ConfigError(Exception):
    """A configuration with one or more problems; `problems` lists each one."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in problems))


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class RunSection(_Section):
    name: str = "default"
    """Run folder name under `out` (an existing folder gets a numeric suffix)."""
    out: str = "runs"
    seed: int = 0
    updates: int = 10
    """Learner updates (weight versions) to train for; the run stops after the last one."""
    max_wall_s: float = 330.0
    """Hard stop for the GRPO phase (seconds); the run ends cleanly after the current update."""
    progress: bool = True
    """Live progress line on stderr."""
    torch_threads: int = 1
    """torch intra-op threads for the policy thread (the learner has its own setting)."""


class EnvSection(_Section):
    name: str = "household"
    max_steps: int = 30
    train_tasks: int = 2000
    """How many tasks of the train split the allocator draws from (0 = all)."""
    options: dict[str, Any] = {}


class PolicySection(_Section):
    backend: str = "torch_tiny"
    model: str = ""
    """A local Hugging Face model directory (the vllm backend; torch_tiny builds its own model)."""
    temperature: float = 0.7
    """Sampling temperature of rollouts (the Selective Rollout setup: 0.7, top-p 0.95)."""
    top_p: float = 0.95
    max_new_tokens: int = 12
    max_batch: int = 64
    """Most act() requests decoded together."""
    max_wait_ms: float = 2.0
    """How long the batcher waits for more requests after the first one arrives."""
    cache_dir: str = ".rollcut_cache"
    """Where the behaviour-cloned warm start is cached (reused by later runs)."""
    options: dict[str, Any] = {}


class PretrainSection(_Section):
    enabled: bool = True
    """Behaviour-clone on expert demonstrations on first use (cached in policy.cache_dir)."""
    demos: int = 600
    """Train tasks whose expert plans are the demonstrations."""
    epochs: int = 8
    lr: float = 6e-3
    batch_size: int = 32
    """Demonstration steps per optimizer update."""


class RolloutSection(_Section):
    group_size: int = 8
    slots: int = 64
    """Concurrent rollouts (a group takes group_size slots)."""


class GateSection(_Section):
    enabled: bool = True
    name: str = "prefix_edit_distance"
    k: int = 10
    tau: float = 0.6
    """Cut iff d_K < tau. The reference's 0.12 (a 7B model) never fires with the tiny default policy,
    whose prefixes are far more diverse; 0.6 is calibrated on it (bench/calibrate_gate.py)."""
    checkpoints: list[int] = []
    """Extra checkpoints K (besides `k`) at which the gate is evaluated; empty = only `k`."""
    shadow: bool = False
    """Record decisions without cutting, to measure precision/recall online."""
    options: dict[str, Any] = {}


class AllocatorSection(_Section):
    name: str = "uniform"
    options: dict[str, Any] = {}


class LearnerSection(_Section):
    batch_groups: int = 8
    """B: groups per update."""
    lr: float = 5e-4
    loss: str = "clipped_ratio"
    clip_eps: float = 0.2
    adv_eps: float = 1e-6
    drop_zero_variance: bool = True
    max_staleness: int = 1
    """Max policy-version lag between generation and training (0 = on-policy)."""
    grad_clip: float = 1.0
    micro_batch: int = 64
    """Items per forward/backward pass (gradients accumulate over micro-batches)."""
    max_items: int = 192
    """Turns sampled per update from the batch's trajectories (0 = all), as the reference's step items."""
    torch_threads: int = 1


class EvalSection(_Section):
    tasks: int = 50
    """Held-out tasks per split for the before/after success measure (0 = skip)."""
    splits: list[str] = msgspec.field(default_factory=lambda: ["heldout_seen", "heldout_unseen"])
    greedy: bool = True


class TransportSection(_Section):
    steps: str = "inproc://rollcut-steps"
    control: str = "inproc://rollcut-control"
    results: str = "inproc://rollcut-results"
    events: str = "inproc://rollcut-events"
    """PUB address that observers (custom stages) subscribe to."""
    hwm: int = 10000


class ProfileSection(_Section):
    enabled: bool = True
    gpu_sample_hz: float = 20.0
    thread_cpu: bool = True
    """Read the thread CPU clock at every span edge (per-stage CPU %); ~2 us more per span."""
    gpu_stages: list[str] = msgspec.field(default_factory=lambda: ["policy", "learner", "vllm"])
    """Stages that compete for GPU utilization samples (the others never get a share)."""


class StageSpec(_Section):
    target: str
    """A registered stage name or `module:Class`."""
    options: dict[str, Any] = {}


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
    profile: ProfileSection = ProfileSection()
    stages: list[StageSpec] = []


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
    checks: list[tuple[bool, str]] = [
        (cfg.run.updates >= 1, "run.updates must be >= 1"),
        (cfg.run.max_wall_s > 0, "run.max_wall_s must be > 0"),
        (cfg.run.torch_threads >= 1, "run.torch_threads must be >= 1"),
        (cfg.env.max_steps >= 1, "env.max_steps must be >= 1"),
        (cfg.env.train_tasks >= 0, "env.train_tasks must be >= 0"),
        (cfg.policy.temperature >= 0, "policy.temperature must be >= 0"),
        (0 < cfg.policy.top_p <= 1, "policy.top_p must be in (0, 1]"),
        (cfg.policy.max_new_tokens >= 1, "policy.max_new_tokens must be >= 1"),
        (cfg.policy.max_batch >= 1, "policy.max_batch must be >= 1"),
        (cfg.policy.max_wait_ms >= 0, "policy.max_wait_ms must be >= 0"),
        (cfg.rollout.group_size >= 2, "rollout.group_size must be >= 2 (GRPO needs a group)"),
        (
            cfg.rollout.slots >= cfg.rollout.group_size,
            f"rollout.slots ({cfg.rollout.slots}) must be >= rollout.group_size ({cfg.rollout.group_size})",
        ),
        (cfg.gate.k >= 1, "gate.k must be >= 1"),
        (cfg.gate.tau >= 0, "gate.tau must be >= 0"),
        (all(k >= 1 for k in cfg.gate.checkpoints), "gate.checkpoints must all be >= 1"),
        (cfg.learner.batch_groups >= 1, "learner.batch_groups must be >= 1"),
        (cfg.learner.lr > 0, "learner.lr must be > 0"),
        (0 <= cfg.learner.clip_eps < 1, "learner.clip_eps must be in [0, 1)"),
        (cfg.learner.max_staleness >= 0, "learner.max_staleness must be >= 0"),
        (cfg.learner.micro_batch >= 1, "learner.micro_batch must be >= 1"),
        (cfg.learner.max_items >= 0, "learner.max_items must be >= 0"),
        (cfg.learner.torch_threads >= 1, "learner.torch_threads must be >= 1"),
        (cfg.eval.tasks >= 0, "eval.tasks must be >= 0"),
        (cfg.transport.hwm >= 1, "transport.hwm must be >= 1"),
        (cfg.profile.gpu_sample_hz > 0, "profile.gpu_sample_hz must be > 0"),
    ]
    return [msg for ok, msg in checks if not ok]


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
            lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
            lines.append("")
        elif isinstance(body, list) and body and all(isinstance(b, dict) for b in body):
            for item in body:
                lines.append(f"[[{section}]]")
                lines += [f"{k} = {_toml_value(v)}" for k, v in item.items()]
                lines.append("")
        else:
            lines.insert(0, f"{section} = {_toml_value(body)}")
    return "\n".join(lines)
