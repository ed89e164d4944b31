"""The run configuration's training sections: `[learner]` (the update) and `[eval]` (the held-out measures and
their task ranges). Like every section, each checks its own value ranges; `pipeline.config` re-exports them.
"""

from __future__ import annotations

import msgspec

from .config_sections import _failed, _Section
from .devices import device_problems
from .task_ranges import CURVE_RANGES, CUT_ORDER, DEFAULT_SIZES, FINAL


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
    thread_nice: int = 0
    """Niceness the learner's update thread adds to itself (0-19, Linux; 0 = as the run): with it and the
    decoding workers (`policy.worker_nice`) below the event loop's thread, the loop takes a core as it wakes
    instead of waiting out an update's time slice on a machine with fewer cores than busy threads (issue 60,
    item 13; `bench/bench_loop.py`). torch's intra-op threads (`torch_threads` > 1) keep the run's priority."""
    trim_memory: bool = True
    """After each update, give the free pages of every glibc malloc arena back to the OS (`malloc_trim`,
    `pipeline/memory.py:trim`, in the learner's thread). An update's activations are hundreds of MB and
    every arena keeps its high-water mark: when updates landed on any of Trio's worker threads, each with an
    arena of its own, the run's RSS climbed by about that much per thread (issue 60, item 13: peak RSS
    2.7-3.6 GB for a tiny policy); they now run on one thread (`pipeline/own_thread.py`), which trims too.
    The cost: the next update faults its pages in again, once per update. false = glibc's default
    (`bench/bench_loop.py` compares them side by side)."""
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
            (0 <= self.thread_nice <= 19, f"learner.thread_nice must be in 0..19, got {self.thread_nice}"),
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
    final: int = DEFAULT_SIZES[FINAL]
    """After test: read only by a declared verdict's runs (`eval.verdict`; `pipeline/task_ranges.py`)."""

    def problems(self) -> list[str]:
        return _failed(*((getattr(self, name) >= 0, f"eval.ranges.{name} must be >= 0") for name in CUT_ORDER))


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
    curve_off_clock: bool = False
    """After the run's timed figures are written (summary.json), measure each version it kept
    (`run.keep_weights_every`) on the periodic measure's tasks (`curve_range`, `curve_tasks`) in the run's own
    process, with its own policy, into heldout_curve.jsonl (`pipeline/run/offclock.py`): none of it is on the
    GRPO clock or in a timed figure. `python run.py curve RUN_DIR` measures the versions a run left unmeasured
    (it stopped first). `run.py ab --to-budget` sets it."""
    reuse_before: bool = False
    """Read the before-GRPO measure from the policy's cache folder when a run from the same warm start (same
    weights, environment, decoding and tasks) stored it, else measure and store it (`pipeline/run/before_cache.py`):
    an A/B study's arms share each seed's warm start. The key holds no code: clear `heldout-*.json` there after
    changing an environment's or a policy's code."""
    verdict: str = ""
    """The declared verdict (`configs/verdicts/<name>.toml`) this run measures for: set by the verdict runner
    (`pipeline.verdict.HARNESS_KEYS`), never by hand. Only then may `range` be final (`pipeline/task_ranges.py`)."""

    def problems(self) -> list[str]:
        problems = self.ranges.problems() + _failed(
            (self.every >= 0, "eval.every must be >= 0"),
            (self.tasks >= 0, "eval.tasks must be >= 0"),
            (self.curve_tasks >= 0, "eval.curve_tasks must be >= 0"),
            (self.range in CUT_ORDER, f"eval.range must be one of {', '.join(CUT_ORDER)}, not {self.range!r}"),
            (self.range != FINAL or bool(self.verdict), f"eval.range = {FINAL!r} is read only by a declared verdict's runs "
             f"(a configs/verdicts/ file with range = {FINAL!r}, run by bench/learn_seeds.py --verdict, sets eval.verdict)"),
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
        return {name: getattr(self.ranges, name) for name in CUT_ORDER}

    def periodic_tasks(self) -> int:
        """Tasks per split of each periodic measure (0: no periodic measure can run)."""
        return self.curve_tasks or min(self.tasks, getattr(self.ranges, self.curve_range))
