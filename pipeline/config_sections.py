"""The run configuration's sections: one frozen, strict Struct per subsystem (`pipeline.config` loads them).

Each section checks its own value ranges (`problems()`); checks that span sections live in
`pipeline.config`. Every name here is re-exported by `pipeline.config`, which is where code imports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from .curve import curve_problems
from .devices import device_problems


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    def problems(self) -> list[str]:
        """This section's out-of-range values, one message each (none by default)."""
        return []


def _failed(*checks: tuple[bool, str]) -> list[str]:
    return [message for ok, message in checks if not ok]


_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


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
    keep_weights_every: int = 0
    """Also keep the policy's weights every this many updates as checkpoints/policy-v<N>.pt (0 = never): a
    policy partway through its run, e.g. for `bench/calibrate_gate.py --weights`, and the held-out curve measured off
    the run's clock (`eval.curve_off_clock`, `run.py curve`)."""
    malloc_arenas: int = 0
    """Cap glibc's malloc arenas (pipeline/memory.py; 0 = glibc's default of 8 per core). Measured, not
    adopted: bench_memory rss_growth 0.01-0.41 in five runs with 2 arenas against 0.45-0.52 with glibc's
    defaults, at the same speed: it slows the creep unreliably; `flat_memory` stops it."""
    flat_memory: bool = False
    """Also fix glibc's mmap threshold, so freed tensors go straight back to the OS: flat RSS (bench_memory
    rss_growth -0.04 to -0.02 from 1,000 to 10,000 env steps) ~40 % lower, but up to ~20 % slower (0.80-0.98x
    env-steps/s side by side: a page-faulting mmap per large tensor). Turn it on for runs of hours."""
    gc_freeze: bool = True
    """Move every object alive when the GRPO phase starts (modules, torch, the environment's tables, the
    built parts: ~200 k objects) out of Python's cyclic garbage collector for the phase (`gc.freeze`,
    `pipeline/memory.py:frozen_heap`), so a full collection traverses only what the phase allocates. A full
    collection holds the GIL: whichever thread triggers it, the learner's included, stalls the event loop
    for as long as it runs (issue 60: loop lag p99 while the learner trains). false = Python's default, for
    `bench/bench_loop.py`'s side-by-side comparison."""
    gil_switch_ms: float = 0.5
    """During the GRPO phase, how long a thread holding the GIL keeps it while another waits
    (`sys.setswitchinterval`; `pipeline/run/runtime.py:gil_switch_interval`); 0 = Python's 5 ms. The event
    loop waits up to this at every socket wait and zmq call while the learner's thread runs Python code."""
    trackers: list[str] = []
    """Experiment trackers fed with the run's figures (`pipeline.trackers`): tensorboard, wandb, mlflow; each
    one's options in `[trackers.<name>]` (docs/trackers.md)."""

    def problems(self) -> list[str]:
        return _failed(
            (self.updates >= 1, "run.updates must be >= 1"),
            (self.max_wall_s > 0, "run.max_wall_s must be > 0"),
            (self.torch_threads >= 1, "run.torch_threads must be >= 1"),
            (self.checkpoint_every >= 0, "run.checkpoint_every must be >= 0"),
            (self.keep_weights_every >= 0, "run.keep_weights_every must be >= 0"),
            (0 <= self.target_heldout <= 1, "run.target_heldout must be in [0, 1]"),
            (self.malloc_arenas >= 0, "run.malloc_arenas must be >= 0 (0 = glibc's default)"),
            (self.gil_switch_ms >= 0, "run.gil_switch_ms must be >= 0 (0 = Python's 5 ms)"),
        )


class EnvSection(_Section):
    name: str = "household"
    max_steps: int = 30
    train_tasks: int = 2000
    """How many tasks of the train split the allocator draws from (0 = all)."""
    options: dict[str, Any] = {}

    def problems(self) -> list[str]:
        return _failed(
            (self.max_steps >= 1, "env.max_steps must be >= 1"),
            (self.train_tasks >= 0, "env.train_tasks must be >= 0"),
        )


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
    workers: int | Literal["auto"] = "auto"
    """Decoding worker processes (`pipeline/run/decoding_pool.py`); 1 = decode in a thread of this process.
    "auto" (the default): from the cores this process may use (`pipeline.devices.auto_workers`: both of 2
    cores, half of more, at most 8) unless the backend fixes it (vllm: 1, one engine batches the run), or on Ray
    from what the cluster holds. On 2 cores 2 workers made 186 env-steps/s
    against 111 with 1 (the default run's GRPO phase 177 s against 314 s; docs/architecture.md)."""
    worker_nice: int = 0
    """Niceness each local decoding worker process adds to itself as it starts (0-19; 0 = as the run): with the
    workers below the run's own process, the coordinator's loop (and the learner's thread) take a core from them
    as they wake instead of queueing behind two CPU-bound decoders (issue 60, item 13; bench/bench_loop.py
    measures it). Ray actors are left as their cluster runs them."""
    max_wait_ms: float = 2.0
    """How long the batcher waits for more requests after the first one arrives."""
    empty_output_action: str = ""
    """The action sent when the model's output parses to nothing ("" = the empty string, an invalid
    command; the Selective Rollout reference sends "look")."""
    cache_dir: str = ".rollcut_cache"
    """Where the behaviour-cloned warm start is cached (reused by later runs)."""
    device: str = "auto"
    """Where the embedded policy decodes and its warm start trains (`pipeline/devices.py`): auto (CUDA when
    torch sees it, else the CPU), cpu, cuda or cuda:N. Decoding processes (`workers`) use it too."""
    options: dict[str, Any] = {}

    def problems(self) -> list[str]:
        return device_problems(self.device, "policy.device") + _failed(
            (self.temperature >= 0, "policy.temperature must be >= 0"),
            (0 < self.top_p <= 1, "policy.top_p must be in (0, 1]"),
            (self.max_new_tokens >= 1, "policy.max_new_tokens must be >= 1"),
            (self.max_batch >= 1, "policy.max_batch must be >= 1"),
            (self.workers == "auto" or self.workers >= 1, "policy.workers must be >= 1 or \"auto\""),
            (self.max_wait_ms >= 0, "policy.max_wait_ms must be >= 0"),
            (0 <= self.worker_nice <= 19, f"policy.worker_nice must be in 0..19, got {self.worker_nice}"),
        )


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
    dagger_lr: float = 0.0
    """Peak learning rate of each DAgger round's training (0 = `lr`): every round restarts the warm-up and
    cosine schedule, so at the BC peak it shakes the weights BC just converged."""

    def problems(self) -> list[str]:
        return _failed(
            (self.demos >= 1, "pretrain.demos must be >= 1"),
            (self.epochs >= 1, "pretrain.epochs must be >= 1"),
            (self.lr > 0, "pretrain.lr must be > 0"),
            (self.batch_size >= 1, "pretrain.batch_size must be >= 1"),
            (0 <= self.noise < 1, "pretrain.noise must be in [0, 1)"),
            (self.dagger_rounds >= 0, "pretrain.dagger_rounds must be >= 0"),
            (self.dagger_tasks >= 1, "pretrain.dagger_tasks must be >= 1"),
            (self.dagger_epochs >= 1, "pretrain.dagger_epochs must be >= 1"),
            (self.dagger_lr >= 0, "pretrain.dagger_lr must be >= 0 (0 = pretrain.lr)"),
        )


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

    def problems(self) -> list[str]:
        return _failed(
            (self.group_size >= 2, "rollout.group_size must be >= 2 (GRPO needs a group)"),
            (
                self.slots >= self.group_size,
                f"rollout.slots ({self.slots}) must be >= rollout.group_size ({self.group_size})",
            ),
            (self.step_timeout_s >= 0, "rollout.step_timeout_s must be >= 0"),
            (0 < self.max_error_rate <= 1, "rollout.max_error_rate must be in (0, 1]"),
            (self.min_trajectories_for_error_rate >= 1, "rollout.min_trajectories_for_error_rate must be >= 1"),
        )


class GateChoice(_Section):
    """A gate and its options, with the shorthands k / tau / checkpoints: declared once, for `[gate]` and
    for a gate stage in `[[stages]]` (`stages.gate_plugin`)."""

    k: int | None = None
    """Shorthand for `options.k`, the gate's checkpoint K (None: the gate's own default, calibrated on this
    workload in docs/gate.md: stall K=8 then 12, 16, 20, tau 0.9; prefix K=12, tau 0.5)."""
    tau: float | None = None
    """Shorthand for `options.tau`: cut iff the gate's statistic < tau (None: the gate's default)."""
    checkpoints: list[int] | None = None
    """Shorthand for `options.checkpoints`: extra checkpoints K besides `k` (None: the gate's default)."""
    shadow: bool = False
    """Record decisions without cutting, to measure precision/recall online."""
    options: dict[str, Any] = {}
    """The gate's own options (its `Options` Struct, decoded strictly): docs/plugins.md."""

    def problems(self) -> list[str]:
        shortcuts = {"k": self.k, "tau": self.tau, "checkpoints": self.checkpoints}
        both = [f"gate.{key} and gate.options.{key} are both set: keep one" for key, value in shortcuts.items()
                if value is not None and key in self.options]
        return both + _failed(
            (self.k is None or self.k >= 1, "gate.k must be >= 1"),
            (self.tau is None or self.tau >= 0, "gate.tau must be >= 0"),
            (all(k >= 1 for k in self.checkpoints or ()), "gate.checkpoints must all be >= 1"),
        )

    def gate_options(self) -> dict[str, Any]:
        """`options` with k / tau / checkpoints folded in where set: what the gate's `Options` decodes."""
        return gate_options(self.options, k=self.k, tau=self.tau, checkpoints=self.checkpoints)


class GateSection(GateChoice):
    enabled: bool = True
    name: str = "stall"
    """The stall gate by default: 0.87x the env steps of no gate at no held-out loss in its declared verdict
    (docs/gate.md, configs/verdicts/stall-gate.result.md) where the prefix gate saved none; `prefix_edit_distance`
    is the Selective Rollout gate."""


def gate_options(
    options: Mapping[str, Any], *, k: int | None = None, tau: float | None = None, checkpoints: Sequence[int] | None = None
) -> dict[str, Any]:
    """A gate's options table with the `[gate]` keys k / tau / checkpoints folded in where they are set
    (None: the gate's own default). `GateSection.problems` refuses a key set both ways."""
    shortcuts = {"k": k, "tau": tau, "checkpoints": None if checkpoints is None else list(checkpoints)}
    return dict(options) | {key: value for key, value in shortcuts.items() if value is not None}


class AllocatorSection(_Section):
    name: str = "uniform"
    options: dict[str, Any] = {}


class TransportSection(_Section):
    steps: str = "inproc://rollcut-steps"
    control: str = "inproc://rollcut-control"
    results: str = "inproc://rollcut-results"
    events: str = "inproc://rollcut-events"
    """PUB address that observers (custom stages) subscribe to."""
    reports: str = "inproc://rollcut-reports"
    """PULL address where stages in other processes report back (learner updates, gate statistics)."""
    mode: str = "threads"
    """`threads`: every stage in this process (the learner's updates in a worker thread). `processes`: the
    gate and learner stages each in a process of their own (inproc addresses become ipc:// files in a
    private folder; see docs/architecture.md, "Stages in other processes")."""
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

    def problems(self) -> list[str]:
        return _failed(
            (self.hwm >= 1, "transport.hwm must be >= 1"),
            (self.drain_s >= 0, "transport.drain_s must be >= 0"),
            (self.mode in ("threads", "processes"), f"transport.mode must be threads or processes, got {self.mode!r}"),
        ) + self._remote_problems() + curve_problems(self.curve_dir)

    def _remote_problems(self) -> list[str]:
        """Every socket of the pipeline is bound in this process: a tcp address must be loopback unless told."""
        problems = []
        for key in ("steps", "control", "results", "events", "reports"):
            address: str = getattr(self, key)
            if address.startswith("tcp://") and not self.allow_remote and not self.curve_dir:
                host = address[len("tcp://") :].rsplit(":", 1)[0]
                if host not in _LOOPBACK:
                    problems.append(
                        f"transport.{key}: {address} accepts frames from other hosts; bind tcp://127.0.0.1:PORT, or set "
                        "transport.curve_dir (keys from `python run.py keys DIR`), or transport.allow_remote = true to "
                        "accept any host (see docs/architecture.md, \"Transport security\")"
                    )
        return problems


class ProfileSection(_Section):
    enabled: bool = True
    gpu_sample_hz: float = 20.0
    thread_cpu: bool = True
    """Read the thread CPU clock at every span edge (per-stage CPU %); ~2 us more per span."""
    gpu_stages: list[str] = msgspec.field(default_factory=lambda: ["policy", "learner", "vllm"])
    """Stages that compete for GPU utilization samples (the others never get a share)."""
    plot: bool = True
    """Draw profile.png at the run's end (false: profile.json only; `run.py ab` sets it for its runs and draws them
    all at the study's end in one process, sparing each run matplotlib's import)."""

    def problems(self) -> list[str]:
        return _failed((self.gpu_sample_hz > 0, "profile.gpu_sample_hz must be > 0"))


class StageSpec(_Section):
    target: str
    """A registered stage name or `module:Class`."""
    options: dict[str, Any] = {}
    process: bool = False
    """Run this stage in a process of its own (`transport.mode = "processes"`; on Ray an actor of its own with
    `[placement.stages]` resources): a slow or crashing plugin cannot stall the coordinator's loop. It sees the
    run through `ctx.subscribe()` as every stage does; what it keeps in memory is its process's."""
