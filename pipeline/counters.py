"""The GRPO phase's one set of counters, and the messages the learner stage reports with.

`PhaseCounters` is written in one place each: the group lifecycle counts finished groups
(`group_finished`) and settled prompts (`prompt_settled`), the runtime's report consumer counts learner
updates (`learner_updated`, from the learner's `LearnerReport`s, wherever the learner runs), the held-out
measure its rows. Admission ids and backfills are the admission loop's; env steps and cuts the rollout
stage's; gate decisions the gate stage's. Nothing here grows with the run except `evaluations` (one row per
`eval.every` updates); loop lag is a constant-memory histogram.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .histogram import LogHistogram
from .ledger import WorkLedger
from .messages import GroupResult
from .outcomes import FIRST_STAGE_KINDS, is_zero_variance, label_rewards

ZERO_VARIANCE_TRAINED = "learner/groups_zero_variance"
"""`LearnerReport.stats` key: how many of the update's trained groups had zero reward variance (no gradient)."""
GROUP_KINDS = ("all_fail", "mixed", "all_succeed")
"""What a complete group's outcomes can be (binary rewards): none, some or all of its rollouts won."""


@dataclass(frozen=True)
class GroupsConsumed:
    """The learner dropped a training group without training on it: frees its staleness budget."""

    zero_variance: bool = False
    cut: bool = False
    """Why: a zero-variance group (dropped by `learner.drop_zero_variance`) or a cut one (refused)."""
    group_id: int = -1
    """The training group dropped (-1: not said)."""
    reason: str = ""
    """`GroupDropped.reason` (`pipeline.outcomes.drop_reason`)."""


@dataclass(frozen=True)
class LearnerReport:
    """One learner update, as the learner stage reports it (in-process, or decoded from the wire)."""

    version: int
    stats: Mapping[str, float]
    train_seconds: float
    weights: Mapping[str, Any]
    """The new policy weights (a detached copy)."""
    trainer_state: Mapping[str, Any] | None
    """`Trainer.state_dict()` at this update boundary (for checkpoints), or None when not asked for."""
    groups_trained: int
    """Groups trained on by this update (they are consumed too)."""
    group_ids: tuple[int, ...] = ()
    """Their group ids (the ledger of work by fate settles them: `pipeline/ledger.py`)."""


@dataclass
class PhaseCounters:
    """Running counts of the phase (summary.json, metrics.jsonl rows and checkpoints are built from it)."""

    groups_finished: int = 0
    groups_cut: int = 0
    groups_complete: int = 0
    zero_variance_complete: int = 0
    all_fail_complete: int = 0
    all_succeed_complete: int = 0
    cut_emission_refused: int = 0
    """Cut groups an allocator handed back for training (refused before the learner)."""
    rollouts_finished: int = 0
    successes: int = 0
    first_stage_groups: int = 0
    first_stage_cut: int = 0
    merged_full_size: int = 0
    """Prompts whose merged group (all its rollout groups) has >= G complete trajectories."""
    merged_zero_variance: int = 0
    groups_received: int = 0
    groups_trained: int = 0
    groups_trained_zero_variance: int = 0
    """Trained groups (counted in `groups_trained`) with zero reward variance: the rest were informative."""
    groups_dropped_zero_variance: int = 0
    groups_dropped_run_ended: int = 0
    """Training groups sent to the learner and neither trained nor dropped when the phase ended."""
    cut_groups_refused: int = 0
    """Cut groups that reached the learner (refused there)."""
    updates: int = 0
    staleness_lag_max: float = 0.0
    items_dropped_stale: int = 0
    items_beyond_max: int = 0
    """Turns left out by the learner's `max_items` sampling."""
    items_trained: int = 0
    lag_sum: float = 0.0
    eval_s: float = 0.0
    start_s: float = 0.0
    """GRPO wall seconds before admission began (the policy's decoders and the stages starting), resumes included:
    the rollout window (`Phase.rollout_wall_s`) is the GRPO wall less this."""
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    loop_lag: LogHistogram = field(default_factory=LogHistogram)
    """Loop-lag samples (seconds) in constant memory."""
    loop_blocks: dict[str, list[float]] = field(default_factory=dict)
    """What held the loop (`pipeline/run/loop_watch.py`): task name or "(wake-up)" -> [count, total s, longest s]."""
    resumed_wall_s: float = 0.0
    """GRPO wall time of the run's earlier segments (before a resume)."""
    resumed_dropped_frames: dict[str, dict[str, int]] = field(default_factory=dict)
    """Frames dropped in the run's earlier segments, by socket and reason."""
    family_of: Mapping[str, str] = field(default_factory=dict)
    """Task id -> task family of the tasks groups may run (empty: `kinds_by_family` stays empty)."""
    kinds_by_family: dict[str, dict[str, int]] = field(default_factory=dict)
    """Complete groups per task family and kind ({family: {all_fail, mixed, all_succeed: count}}): which
    families can teach (mixed) and which the policy never or always wins."""
    ledger: WorkLedger = field(default_factory=WorkLedger)
    """Decoder work by fate (`pipeline/ledger.py`): the lifecycle and the learner's reports settle each group's."""
    window_rollouts: int = 0
    window_successes: int = 0
    window_steps_at: int = 0
    window_started: float = 0.0

    def group_finished(self, result: GroupResult) -> None:
        self.groups_finished += 1
        if result.kind in FIRST_STAGE_KINDS:
            self.first_stage_groups += 1
            self.first_stage_cut += result.cut
        if result.cut:
            self.groups_cut += 1
            return
        rewards = label_rewards(result)
        self.groups_complete += 1
        self.zero_variance_complete += is_zero_variance(rewards)
        wins = sum(tr.success for tr in result.trajectories)
        self.all_fail_complete += wins == 0
        self.all_succeed_complete += wins == len(rewards)
        family = self.family_of.get(result.task_id)
        if family is not None:
            kind = "all_fail" if wins == 0 else "all_succeed" if wins == len(rewards) else "mixed"
            self.kinds_by_family.setdefault(family, dict.fromkeys(GROUP_KINDS, 0))[kind] += 1
        self.rollouts_finished += len(rewards)
        self.successes += wins
        self.window_rollouts += len(rewards)
        self.window_successes += wins

    def prompt_settled(self, rewards: list[float], group_size: int) -> None:
        """A prompt's merged group settled: count it if it has a full group of complete trajectories."""
        if len(rewards) >= group_size:
            self.merged_full_size += 1
            self.merged_zero_variance += is_zero_variance(rewards)

    def learner_updated(self, report: LearnerReport) -> None:
        self.updates += 1
        self.groups_trained += report.groups_trained
        self.groups_received += report.groups_trained
        stats = report.stats
        self.groups_trained_zero_variance += int(stats.get(ZERO_VARIANCE_TRAINED, 0.0))
        self.staleness_lag_max = max(self.staleness_lag_max, stats.get("staleness_lag_max", 0.0))
        items = stats.get("learner/items", 0.0)
        self.items_trained += int(items)
        self.lag_sum += stats.get("staleness_lag_mean", 0.0) * items
        self.items_dropped_stale += int(stats.get("learner/items_dropped_stale", 0.0))
        self.items_beyond_max += int(stats.get("learner/items_beyond_max", 0.0))
        self.ledger.learner_trained(report.group_ids, train_seconds=report.train_seconds, stale=stats)

    def learner_dropped(self, dropped: GroupsConsumed) -> None:
        self.groups_received += 1
        self.groups_dropped_zero_variance += dropped.zero_variance
        self.cut_groups_refused += dropped.cut
        self.ledger.learner_dropped(dropped.group_id, cut=dropped.cut)

    def heldout_measured(self, row: dict[str, Any], seconds: float) -> None:
        self.evaluations.append(row)
        self.eval_s += seconds

    def loop_lag_p99_ms(self) -> float:
        return self.loop_lag.quantile(0.99) * 1e3
