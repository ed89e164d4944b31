"""The run configuration's sections: one frozen, strict Struct per subsystem (`pipeline.config` loads them).

Each section checks its own value ranges (`problems()`); checks that span sections live in
`pipeline.config`. Every name here is re-exported by `pipeline.config`, which is where code imports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from .curve import curve_problems
from .devices import device_problems
from .task_ranges import CURVE_RANGES, DEFAULT_SIZES, RANGES


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
    malloc_arenas: int = 0
    """Cap glibc's malloc arenas (pipeline/memory.py; 0 = glibc's default of 8 per core). Measured, not
    adopted: bench_memory rss_growth 0.01-0.41 in five runs with 2 arenas against 0.45-0.52 with glibc's
    defaults, at the same speed: it slows the creep unreliably; `flat_memory` stops it."""
    flat_memory: bool = False
    """Also fix glibc's mmap threshold, so freed tensors go straight back to the OS: flat RSS (bench_memory
    rss_growth -0.04 to -0.02 from 1,000 to 10,000 env steps) ~40 % lower, but up to ~20 % slower (0.80-0.98x
    env-steps/s side by side: a page-faulting mmap per large tensor). Turn it on for runs of hours."""
    trackers: list[str] = []
    """Experiment trackers fed with the run's figures (`pipeline.trackers`): tensorboard, wandb, mlflow; each
    one's options in `[trackers.<name>]` (docs/trackers.md)."""

    def problems(self) -> list[str]:
        return _failed(
            (self.updates >= 1, "run.updates must be >= 1"),
            (self.max_wall_s > 0, "run.max_wall_s must be > 0"),
            (self.torch_threads >= 1, "run.torch_threads must be >= 1"),
            (self.checkpoint_every >= 0, "run.checkpoint_every must be >= 0"),
            (0 <= self.target_heldout <= 1, "run.target_heldout must be in [0, 1]"),
            (self.malloc_arenas >= 0, "run.malloc_arenas must be >= 0 (0 = glibc's default)"),
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
    workers: int = 1
    """Decoding worker processes (`pipeline/run/decoding_pool.py`); 1 = decode in a thread of this process.
    On 2 cores use 2: the default run made 186 env-steps/s with 2 workers against 111 with 1 (GRPO phase
    177 s against 314 s, same seed, one after the other; docs/architecture.md)."""
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
            (self.workers >= 1, "policy.workers must be >= 1"),
            (self.max_wait_ms >= 0, "policy.max_wait_ms must be >= 0"),
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
    """The stall gate by default: in the A/B table (docs/gate.md; dev, 3 seeds, at 414ca0f) it saved 22 % of env
    steps at no held-out loss where the prefix gate saved none; `prefix_edit_distance` is the Selective Rollout gate."""


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


class LearnerSection(_Section):
    batch_groups: int = 8
    """B: groups per update."""
    lr: float = 5e-4
    lr_schedule: str = "constant"
    """How the lr moves over the run's `run.updates` (`learner.schedules.LR_SCHEDULES`): constant, linear or
    cosine, from `lr` down to `lr` x `lr_floor`; a run that ends on its wall budget first stops part-way."""
    lr_floor: float = 0.1
    """The scheduled lr's last value as a fraction of `lr` (linear, cosine)."""
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
    negative_weight: float = 1.0
    """Scale of negative advantages: 1 = GRPO; 0 = positive-sample reinforcement (learn from a group's
    better-than-average trajectories only; Zhu et al. 2025 find it sharpens pass@1 while full GRPO keeps
    pass@k). Turns whose scaled advantage is 0 are left out like zero-advantage turns."""
    step_weight: float = 0.0
    """GiGPO (Feng et al. 2025): each turn's advantage adds this times a step-level advantage, its discounted
    return against the group's other turns from the same anchor state (same observation and commands;
    `learner/advantages.py`). 0 = GRPO's one advantage per trajectory."""
    gamma: float = 0.95
    """Discount of the step-level returns (`step_weight` > 0): among winning paths from a state, shorter ones score higher."""
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
    costs ~50 s of one CPU core, during which admission waits (set 0 where the learner has the time). The
    turns left out are counted (`learner/items_beyond_max`, summary `items_beyond_max`)."""
    kl_coef: float = 0.0
    """Weight of a KL(pi || warm start) penalty per token (0 = off; costs one more forward pass)."""
    max_kl: float = 0.0
    """End an update early once its approx KL to the behaviour policy exceeds this (0 = off); where it is
    measured is `kl_stop`. With `ema` > 0 the learner's iterate starts each update away from the behaviour
    (published) weights, so the threshold must sit above the KL an update starts with."""
    kl_stop: str = "epoch"
    """Where `max_kl` is checked: "epoch" (after each epoch over the batch; the next one is not run) or
    "step" (each mini-batch before its optimizer step, which is then not taken)."""
    ema: float = 0.0
    """Publish an exponential moving average of the learner's weights instead of its latest iterate: after
    each update, published = ema x published + (1 - ema) x learner weights (0 = off). Rollouts, held-out
    measures and checkpoints all see the published weights; the learner's clipped ratio is against them."""
    skip_confident: float = 0.0
    """Leave out of the forward / backward passes the turns whose action had at least this probability under
    the behaviour policy (0 = train every turn). A sharp policy acts with p ~ 1 on most turns, and a turn's
    gradient scales with 1 - p: skipping them keeps every mini-batch and its aggregation weights as they
    were and saves their compute. Loss terms of the KL penalty (`kl_coef`) on those turns go too."""
    torch_threads: int = 1
    device: str = "auto"
    """Where the learner trains (`pipeline/devices.py`): auto (CUDA when torch sees it, else the CPU), cpu,
    cuda or cuda:N. The weights it publishes and checkpoints are CPU tensors whatever it is."""
    bf16: bool = False
    """On CUDA, run the learner's forward passes under bfloat16 autocast (its weights and optimizer stay
    float32). Off by default: the log-probs it recomputes then differ from the sampled ones by bf16 rounding,
    so the ratio is no longer exactly 1 at unchanged weights (docs/policy.md, "Devices")."""

    def problems(self) -> list[str]:
        return device_problems(self.device, "learner.device") + _failed(
            (not (self.bf16 and self.device == "cpu"), "learner.bf16 needs a CUDA learner.device (bf16 autocast is for CUDA)"),
            (0 <= self.skip_confident < 1, "learner.skip_confident must be in [0, 1)"),
            (self.batch_groups >= 1, "learner.batch_groups must be >= 1"),
            (self.lr > 0, "learner.lr must be > 0"),
            (0 <= self.lr_floor <= 1, "learner.lr_floor must be in [0, 1]"),
            (0 <= self.clip_eps < 1, "learner.clip_eps must be in [0, 1)"),
            (self.max_staleness >= 0, "learner.max_staleness must be >= 0"),
            (self.micro_batch >= 1, "learner.micro_batch must be >= 1"),
            (self.max_items >= 0, "learner.max_items must be >= 0"),
            (self.torch_threads >= 1, "learner.torch_threads must be >= 1"),
            (self.epochs >= 1, "learner.epochs must be >= 1"),
            (self.minibatch_items >= 0, "learner.minibatch_items must be >= 0"),
            (self.norm_tokens > 0, "learner.norm_tokens must be > 0"),
            (self.kl_coef >= 0, "learner.kl_coef must be >= 0"),
            (self.max_kl >= 0, "learner.max_kl must be >= 0"),
            (self.kl_stop in ("epoch", "step"), f"learner.kl_stop must be 'epoch' or 'step', not {self.kl_stop!r}"),
            (0 <= self.ema < 1, "learner.ema must be in [0, 1)"),
            (0 <= self.negative_weight <= 1, "learner.negative_weight must be in [0, 1]"),
            (self.step_weight >= 0, "learner.step_weight must be >= 0"),
            (0 < self.gamma <= 1, "learner.gamma must be in (0, 1]"),
        )


class RangeSizes(_Section):
    """Tasks per held-out split in each range, cut from the start of the split in this order
    (`pipeline/task_ranges.py`). 400 test tasks per split keep the 95 % margin of the mean of both splits
    near +-3 points at ~20 % success; dev is the first 200, which every figure before the ranges measured."""

    dev: int = DEFAULT_SIZES["dev"]
    valid: int = DEFAULT_SIZES["valid"]
    test: int = DEFAULT_SIZES["test"]

    def problems(self) -> list[str]:
        return _failed(*((getattr(self, name) >= 0, f"eval.ranges.{name} must be >= 0") for name in RANGES))


class EvalSection(_Section):
    tasks: int = 200
    """Held-out tasks per split for the before/after success measure, the first of `range` (0 = skip).
    200 per split keep the 95 % margin of the mean of both splits near +-4 points at ~20 % success;
    ~110 CPU-s per 200 + 200 tasks."""
    range: str = "dev"
    """The range of each held-out split the before/after measure reads: dev (tuning, the default), valid, or
    test (kept for the before/after of a verdict declared before it runs; docs/learning.md, "Task ranges")."""
    ranges: RangeSizes = RangeSizes()
    splits: list[str] = msgspec.field(default_factory=lambda: ["heldout_seen", "heldout_unseen"])
    greedy: bool = True
    every: int = 0
    """Also measure held-out success every N learner updates during GRPO (0 = only before and after)."""
    curve_range: str = "valid"
    """The range the periodic measure (`every`) and the stop rule (`run.target_heldout`) watch: valid or dev,
    never test."""
    curve_tasks: int = 0
    """Tasks per split of each periodic measure, the first of `curve_range` (0 = `tasks`, at most the range's size)."""

    def problems(self) -> list[str]:
        problems = self.ranges.problems() + _failed(
            (self.every >= 0, "eval.every must be >= 0"),
            (self.tasks >= 0, "eval.tasks must be >= 0"),
            (self.curve_tasks >= 0, "eval.curve_tasks must be >= 0"),
            (self.range in RANGES, f"eval.range must be one of {', '.join(RANGES)}, not {self.range!r}"),
            (self.curve_range in CURVE_RANGES, f"eval.curve_range must be one of {', '.join(CURVE_RANGES)}, not "
             f"{self.curve_range!r} (periodic curves and stop rules never look at the test range)"),
        )
        for key, count, name in (("tasks", self.tasks, self.range), ("curve_tasks", self.curve_tasks, self.curve_range)):
            size = getattr(self.ranges, name, None)  # None: an unknown range, named above
            if size is not None and count > size:
                problems.append(f"eval.{key} ({count}) is more than the {name} range holds ({size} per split; eval.ranges.{name})")
        return problems

    def sizes(self) -> dict[str, int]:
        """Tasks per split in each range: what `pipeline.task_ranges` cuts by."""
        return {name: getattr(self.ranges, name) for name in RANGES}

    def periodic_tasks(self) -> int:
        """Tasks per split of each periodic measure (0: no periodic measure can run)."""
        return self.curve_tasks or min(self.tasks, getattr(self.ranges, self.curve_range))


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

    def problems(self) -> list[str]:
        return _failed((self.gpu_sample_hz > 0, "profile.gpu_sample_hz must be > 0"))


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
    trackers: dict[str, dict[str, Any]] = {}
    """Each tracker's options, `[trackers.<name>]` (the tracker is chosen by `run.trackers`)."""
