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

from .curve import curve_problems


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
    target_heldout: float = 0.0
    """Stop once held-out success (mean over eval splits, measured every `eval.every` updates) reaches
    this (0 = off)."""
    torch_threads: int = 1
    """torch intra-op threads for the policy thread (the learner has its own setting)."""
    checkpoint_every: int = 1
    """Write checkpoints/state.pt every this many learner updates (0 = only at the end and on Ctrl-C);
    `python run.py resume RUN_DIR` continues from it."""
    malloc_arenas: int = 0
    """Cap glibc's malloc arenas (pipeline/memory.py; 0 = glibc's default of 8 per core). Measured, not
    adopted: bench_memory rss_growth 0.01-0.41 in five runs with 2 arenas against 0.45-0.52 with glibc's
    defaults, at the same speed: it slows the creep unreliably; `flat_memory` stops it."""
    flat_memory: bool = False
    """Also fix glibc's mmap threshold, so freed tensors go straight back to the OS: flat RSS (bench_memory
    rss_growth -0.04 to -0.02 from 1,000 to 10,000 env steps) ~40 % lower, but up to ~20 % slower (0.80-0.98x
    env-steps/s side by side: a page-faulting mmap per large tensor). Turn it on for runs of hours."""


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
    workers: int = 1
    """Decoding worker processes (`stages/policy/workers.py`); 1 = decode in a thread of this process."""
    max_wait_ms: float = 2.0
    """How long the batcher waits for more requests after the first one arrives."""
    empty_output_action: str = ""
    """The action sent when the model's output parses to nothing ("" = the empty string, an invalid
    command; the Selective Rollout reference sends "look")."""
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
    noise: float = 0.15
    """Noise-injected demonstrations (DART): the probability that a demonstration step executes a random
    other admissible command instead of the expert's; every state reached is labelled by the expert's
    action from it, so the policy also sees how to recover. Needs a suite whose expert acts from any
    state (`stages.envs.base.RecoveringExpert`); other suites get plain behaviour cloning and a warning
    (`policy.bc.noise_ignored`); 0 = plain behaviour cloning. 0.15 measured best
    (docs/policy.md): held-out 18.5 % / 16.0 % against 15.5 % / 8.0 % without noise."""
    dagger_rounds: int = 0
    """DAgger rounds after behaviour cloning: play the policy (at the rollout temperature) on fresh train
    tasks, label every state with the expert's action, add them to the demonstrations, train again."""
    dagger_tasks: int = 200
    """Train tasks played per DAgger round (taken after the demonstration tasks)."""
    dagger_epochs: int = 2
    """Epochs over all demonstrations gathered so far after each DAgger round."""


class RolloutSection(_Section):
    group_size: int = 8
    slots: int = 64
    """Concurrent rollouts (a group takes group_size slots)."""
    max_error_rate: float = 0.2
    """Stop the run (naming the stage and the first exception) once more than this fraction of
    trajectories failed, counted after `min_trajectories_for_error_rate` trajectories."""
    min_trajectories_for_error_rate: int = 50
    step_timeout_s: float = 0.0
    """Fail a trajectory whose env step takes longer (0 = no limit; > 0 runs env steps in worker threads)."""


class GateSection(_Section):
    enabled: bool = True
    name: str = "prefix_edit_distance"
    k: int = 12
    tau: float = 0.5
    """Cut iff d_K < tau. The reference's 0.12 (a 7B model) never fires with the tiny default policy,
    whose prefixes are far more diverse; K=12, tau=0.5 saves most at precision >= 0.8 on this workload
    (docs/gate.md, bench/calibrate_gate.py). The stall gate (configs/stall.toml) saves far more."""
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
    """Per-token loss terms (`learner.losses.LOSSES`): clipped_ratio (GRPO/PPO) or reinforce (the reference)."""
    aggregation: str = "trajectory_mean"
    """How token terms are weighted (`learner.aggregation.AGGREGATIONS`): turn_mean, trajectory_mean,
    token_mean, constant (Dr. GRPO, with `norm_tokens`)."""
    norm_tokens: float = 64.0
    """The constant normaliser (tokens per trajectory) of the `constant` aggregation."""
    epochs: int = 1
    """Passes over an update's items (PPO-style); each mini-batch is one optimizer step."""
    minibatch_items: int = 0
    """Items per optimizer step (0 = all items of the update in one step)."""
    clip_eps: float = 0.2
    adv_eps: float = 1e-6
    drop_zero_variance: bool = True
    keep_zero_advantage_items: bool = False
    """Train on zero-advantage turns too (they add no gradient but dilute the mean: the reference's setting)."""
    max_staleness: int = 1
    """Bound on policy versions: every trained turn has learner version - turn version <= max_staleness
    (older turns are dropped and counted); admission is paced so that few are."""
    grad_clip: float = 1.0
    micro_batch: int = 64
    """Items per forward/backward pass (gradients accumulate over micro-batches; weights are exact)."""
    max_items: int = 192
    """Turns sampled per update from the batch's trajectories (0 = all), as the reference's step items. The
    default keeps the 10-minute default run within its budget: training on all ~1,500 turns of an update
    costs ~50 s of one CPU core, during which admission waits (set 0 where the learner has the time)."""
    kl_coef: float = 0.0
    """Weight of a KL(pi || warm start) penalty per token (0 = off; costs one more forward pass)."""
    max_kl: float = 0.0
    """Stop an update's epochs early once an epoch's approx KL to the behaviour policy exceeds this (0 = off)."""
    torch_threads: int = 1


class EvalSection(_Section):
    tasks: int = 50
    """Held-out tasks per split for the before/after success measure (0 = skip)."""
    splits: list[str] = msgspec.field(default_factory=lambda: ["heldout_seen", "heldout_unseen"])
    greedy: bool = True
    every: int = 0
    """Also measure held-out success every N learner updates during GRPO (0 = only before and after)."""


class TransportSection(_Section):
    steps: str = "inproc://rollcut-steps"
    control: str = "inproc://rollcut-control"
    results: str = "inproc://rollcut-results"
    events: str = "inproc://rollcut-events"
    """PUB address that observers (custom stages) subscribe to."""
    hwm: int = 10000
    drain_s: float = 5.0
    """After the last update, how long custom stages get to read the event stream up to `PhaseFinished`
    and return before they are cancelled."""
    allow_remote: bool = False
    """Allow tcp addresses other than loopback without CURVE (the sockets then accept frames from any
    host; see docs/architecture.md, "Transport security")."""
    curve_dir: str = ""
    """A keys folder from `python run.py keys DIR`: every tcp socket then uses ZeroMQ CURVE and admits
    only the public keys in DIR/authorized/ (pipeline/curve.py); non-loopback binds are then allowed."""


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
        (cfg.run.checkpoint_every >= 0, "run.checkpoint_every must be >= 0"),
        (cfg.env.max_steps >= 1, "env.max_steps must be >= 1"),
        (cfg.env.train_tasks >= 0, "env.train_tasks must be >= 0"),
        (cfg.policy.temperature >= 0, "policy.temperature must be >= 0"),
        (0 < cfg.policy.top_p <= 1, "policy.top_p must be in (0, 1]"),
        (cfg.policy.max_new_tokens >= 1, "policy.max_new_tokens must be >= 1"),
        (cfg.policy.max_batch >= 1, "policy.max_batch must be >= 1"),
        (cfg.policy.workers >= 1, "policy.workers must be >= 1"),
        (cfg.policy.max_wait_ms >= 0, "policy.max_wait_ms must be >= 0"),
        (cfg.rollout.group_size >= 2, "rollout.group_size must be >= 2 (GRPO needs a group)"),
        (
            cfg.rollout.slots >= cfg.rollout.group_size,
            f"rollout.slots ({cfg.rollout.slots}) must be >= rollout.group_size ({cfg.rollout.group_size})",
        ),
        (cfg.rollout.step_timeout_s >= 0, "rollout.step_timeout_s must be >= 0"),
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
        (cfg.learner.epochs >= 1, "learner.epochs must be >= 1"),
        (cfg.learner.minibatch_items >= 0, "learner.minibatch_items must be >= 0"),
        (cfg.learner.norm_tokens > 0, "learner.norm_tokens must be > 0"),
        (cfg.learner.kl_coef >= 0, "learner.kl_coef must be >= 0"),
        (cfg.learner.max_kl >= 0, "learner.max_kl must be >= 0"),
        (0 < cfg.rollout.max_error_rate <= 1, "rollout.max_error_rate must be in (0, 1]"),
        (cfg.rollout.min_trajectories_for_error_rate >= 1, "rollout.min_trajectories_for_error_rate must be >= 1"),
        (cfg.eval.every >= 0, "eval.every must be >= 0"),
        (0 <= cfg.run.target_heldout <= 1, "run.target_heldout must be in [0, 1]"),
        (
            cfg.run.target_heldout == 0 or (cfg.eval.every > 0 and cfg.eval.tasks > 0),
            "run.target_heldout needs eval.every > 0 and eval.tasks > 0 (held-out success is measured then)",
        ),
        (cfg.pretrain.demos >= 1, "pretrain.demos must be >= 1"),
        (cfg.pretrain.epochs >= 1, "pretrain.epochs must be >= 1"),
        (cfg.pretrain.lr > 0, "pretrain.lr must be > 0"),
        (cfg.pretrain.batch_size >= 1, "pretrain.batch_size must be >= 1"),
        (0 <= cfg.pretrain.noise < 1, "pretrain.noise must be in [0, 1)"),
        (cfg.pretrain.dagger_rounds >= 0, "pretrain.dagger_rounds must be >= 0"),
        (cfg.pretrain.dagger_tasks >= 1, "pretrain.dagger_tasks must be >= 1"),
        (cfg.pretrain.dagger_epochs >= 1, "pretrain.dagger_epochs must be >= 1"),
        (cfg.eval.tasks >= 0, "eval.tasks must be >= 0"),
        (cfg.run.malloc_arenas >= 0, "run.malloc_arenas must be >= 0 (0 = glibc's default)"),
        (cfg.transport.hwm >= 1, "transport.hwm must be >= 1"),
        (cfg.transport.drain_s >= 0, "transport.drain_s must be >= 0"),
        (cfg.profile.gpu_sample_hz > 0, "profile.gpu_sample_hz must be > 0"),
    ]
    return [msg for ok, msg in checks if not ok] + _remote_problems(cfg.transport) + curve_problems(cfg.transport.curve_dir)


_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


def _remote_problems(t: TransportSection) -> list[str]:
    """Every socket of the pipeline is bound in this process: a tcp address must be loopback unless told."""
    problems = []
    for key in ("steps", "control", "results", "events"):
        address: str = getattr(t, key)
        if address.startswith("tcp://") and not t.allow_remote and not t.curve_dir:
            host = address[len("tcp://") :].rsplit(":", 1)[0]
            if host not in _LOOPBACK:
                problems.append(
                    f"transport.{key}: {address} accepts frames from other hosts; bind tcp://127.0.0.1:PORT, or set "
                    "transport.curve_dir (keys from `python run.py keys DIR`), or transport.allow_remote = true to "
                    "accept any host (see docs/architecture.md, \"Transport security\")"
                )
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
