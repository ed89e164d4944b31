"""The run's summary (summary.json / summary.md figures) and the held-out report helpers of the job.

Part of the job's composition root (`pipeline/run/job.py`): it reads the GRPO phase's outcome and the
evaluation reports and turns them into the flat record that `write_summary` and the A/B tables read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.config import RunConfig
from pipeline.memory import peak_rss_mb
from pipeline.student_t import t_interval
from stages.evaluate import EpisodeOutcome, EvalReport, summarize
from stages.policy.base import PolicyStatistics

from . import build
from .grpo import GrpoOutcome
from .heldout import mean_success
from .loop_watch import blockers


def fmt_eval(reports: dict[str, EvalReport]) -> str:
    return ", ".join(f"{split} {r.success:.1%} ({len(r.episodes)} tasks)" for split, r in reports.items()) or "skipped (eval.tasks = 0)"


def family_table(before: dict[str, EvalReport], after: dict[str, EvalReport]) -> str:
    lines = ["| split | family | before | after |", "|---|---|---|---|"]
    for split, report in before.items():
        for family, value in sorted(report.per_family.items()):
            lines.append(f"| {split} | {family} | {value:.1%} | {after[split].per_family.get(family, float('nan')) if split in after else float('nan'):.1%} |")
    return "\n".join(lines)


def group_kinds_table(by_family: Mapping[str, Mapping[str, int]]) -> str:
    """Complete training groups per task family: all-fail / mixed / all-succeed (only mixed ones teach)."""
    lines = ["| family | all-fail | mixed | all-succeed |", "|---|---|---|---|"]
    for family, kinds in sorted(by_family.items()):
        lines.append(f"| {family} | {kinds['all_fail']} | {kinds['mixed']} | {kinds['all_succeed']} |")
    return "\n".join(lines)


def reports_to_json(reports: dict[str, EvalReport]) -> dict[str, list[list[Any]]]:
    return {split: [[e.task_id, e.family, e.won, e.steps] for e in r.episodes] for split, r in reports.items()}


def policy_figures(stats: PolicyStatistics) -> dict[str, Any]:
    """The policy's counts over the whole run (warm start, held-out measures and GRPO: the backend counts from
    its start), the figures its backend does not keep left out: e.g. the hf backend's rows, commands and prompt
    tokens scored, vLLM's weight syncs."""
    return {k: v for k, v in asdict(stats).items() if v is not None}


EPISODES_FILE = "heldout_episodes.json"


def write_episodes(run_dir: Path, range_name: str, before: dict[str, EvalReport], after: dict[str, EvalReport]) -> None:
    """heldout_episodes.json: every held-out episode before and after GRPO, `[task id, family, won, steps]` per
    split (the per-task comparison behind `heldout_change`: which tasks the run learned, which it lost)."""
    (run_dir / EPISODES_FILE).write_text(json.dumps(
        {"range": range_name, "before": reports_to_json(before), "after": reports_to_json(after)}) + "\n")


def write_measure(path: Path, range_name: str, reports: dict[str, EvalReport]) -> None:
    """One held-out measure's episodes (`run.py pretrain --episodes`) in heldout_episodes.json's layout, as its
    `before`: pairs by task with a run's before or after (`bench/paired_heldout.py`)."""
    path.write_text(json.dumps({"range": range_name, "before": reports_to_json(reports)}) + "\n")


def reports_from_json(data: dict[str, list[list[Any]]]) -> dict[str, EvalReport]:
    return {split: summarize([EpisodeOutcome(*row) for row in rows]) for split, rows in data.items()}


def paired_change(before: dict[str, EvalReport], after: dict[str, EvalReport]) -> dict[str, Any] | None:
    """Held-out success after - before over the tasks measured both times (matched by split and task id), with
    the Student-t 95 % interval of the per-task differences (each -1, 0 or +1): the same tasks before and after, so
    the task-to-task spread cancels and the interval is narrower than two independent proportions'. None when no
    task was measured both times."""
    won_before = {(split, e.task_id): e.won for split, r in before.items() for e in r.episodes}
    diffs = [int(e.won) - int(won_before[split, e.task_id]) for split, r in after.items() for e in r.episodes
             if (split, e.task_id) in won_before]
    if not diffs:
        return None
    change, low, high = t_interval(diffs)
    return {"tasks": len(diffs), "change": change, "ci95": [low, high],
            "gained": diffs.count(1), "lost": diffs.count(-1)}


def fmt_change(change: Mapping[str, Any] | None) -> str:
    if change is None:
        return "no task measured both times"
    low, high = change["ci95"]
    interval = f" [{100 * low:+.1f}, {100 * high:+.1f}] (95 % t)" if low is not None else ""
    return (f"{100 * change['change']:+.1f} points{interval} over {change['tasks']} tasks "
            f"({change['gained']} won only after, {change['lost']} only before)")


def summary(
    cfg: RunConfig, outcome: GrpoOutcome, before: dict[str, EvalReport], after: dict[str, EvalReport], warm_start_s: float, wall_s: float,
    *, profiler_overhead_pct: float | None, generated_tokens: int | None = None, machine_load: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Every figure of the run, flat (dicts only for per-kind and per-split breakdowns). Held-out figures name
    their task range (`heldout_range`, `heldout_curve_range`: pipeline/task_ranges.py); `machine_load` is the
    GRPO phase's load (pipeline/machine_load.py)."""
    gate_stats = outcome.gate.statistics() if outcome.gate is not None else {}
    alloc = dict(outcome.allocator.statistics())
    return _group_figures(cfg, outcome, gate_stats) | _throughput_figures(outcome, gate_stats, alloc, generated_tokens) | {
        "heldout_success_before": mean_success(before),
        "heldout_success_after": mean_success(after),
        "heldout_before": {s: r.success for s, r in before.items()},
        "heldout_after": {s: r.success for s, r in after.items()},
        "heldout_change": paired_change(before, after),
        "heldout_range": cfg.eval.range,
        "heldout_tasks_per_split": cfg.eval.tasks,
        "heldout_curve_range": cfg.eval.curve_range if cfg.eval.every else None,
        "heldout_curve_tasks_per_split": cfg.eval.periodic_tasks() if cfg.eval.every else None,
        "heldout_curve": outcome.counters.evaluations,
        "eval_s": outcome.counters.eval_s,
        "loop_lag_p99_ms": outcome.loop_lag_p99_ms(),
        "loop_blockers": blockers(outcome.counters.loop_blocks),
        "profiler_overhead_pct": profiler_overhead_pct,
        "warm_start_s": warm_start_s,
        "grpo_wall_s": outcome.wall_s,
        "grpo_start_s": outcome.counters.start_s,
        "wall_s": wall_s,
        "allocator_stats": alloc,
        "peak_rss_mb": peak_rss_mb(),
        "dropped_frames_total": sum(n for counts in outcome.dropped_frames.values() for n in counts.values()),
        "dropped_frames": outcome.dropped_frames,
        "ledger": outcome.counters.ledger.figures(grpo_wall_s=outcome.wall_s, slots=cfg.rollout.slots,
                                                  pacer_held_slot_s=outcome.pacer_held_slot_s, busy_slot_s=outcome.busy_slot_s),
    } | dict(machine_load or {})


def gate_label(cfg: RunConfig, outcome: GrpoOutcome) -> str:
    """"name K=.. tau=.." from the gate's resolved options (its own defaults included), "off" without one."""
    if not cfg.gate.enabled or outcome.gate is None:
        return "off"
    gate = build.gate(cfg)  # the gate as configured, its own defaults resolved (wherever the stage ran)
    options = getattr(gate, "options", None)  # a plugin gate need not keep its options
    shown = [f"{label}={getattr(options, key)}" for label, key in (("K", "k"), ("tau", "tau"))
             if getattr(options, key, None) is not None]  # (the zero_variance gate has neither: None)
    return " ".join([cfg.gate.name, *shown]) + (" shadow" if cfg.gate.shadow else "")


def _group_figures(cfg: RunConfig, outcome: GrpoOutcome, gate_stats: Mapping[str, Any]) -> dict[str, Any]:
    """What happened to the groups: admitted, cut, trained, by outcome and by kind."""
    counters = outcome.counters  # one set of counters (pipeline.counters.PhaseCounters)
    return {
        "seed": cfg.run.seed,
        "gate": gate_label(cfg, outcome),
        "allocator": cfg.allocator.name,
        "stop_reason": outcome.stop_reason,
        "groups_admitted": outcome.lifecycle.groups_admitted,
        "groups_cut": counters.groups_cut,
        "groups_backfilled": outcome.lifecycle.backfills,
        "groups_trained": counters.groups_trained,
        "groups_trained_informative": counters.groups_trained - counters.groups_trained_zero_variance,
        "groups_dropped_zero_variance": counters.groups_dropped_zero_variance,
        "groups_dropped_run_ended": counters.groups_dropped_run_ended,
        "cut_groups_reaching_learner": counters.cut_groups_refused + counters.cut_emission_refused,
        "zero_variance_fraction": counters.merged_zero_variance / counters.merged_full_size if counters.merged_full_size else None,
        "zero_variance_prompts": counters.merged_full_size,
        "first_stage_groups": counters.first_stage_groups,
        "first_stage_cut_fraction": counters.first_stage_cut / counters.first_stage_groups if counters.first_stage_groups else None,
        "gate_decisions_by_kind": {k.rsplit("/", 1)[1]: v for k, v in gate_stats.items() if k.startswith("gate/decisions/")},
        "gate_groups_seen_by_kind": {k.rsplit("/", 1)[1]: v for k, v in gate_stats.items() if k.startswith("gate/groups_seen/")},
        "cuts_late": outcome.rollout.cuts_late,
        "groups_all_fail": counters.all_fail_complete,
        "groups_mixed": counters.groups_complete - counters.all_fail_complete - counters.all_succeed_complete,
        "groups_all_succeed": counters.all_succeed_complete,
        "groups_by_family": {family: dict(kinds) for family, kinds in sorted(counters.kinds_by_family.items())},
    }


def _throughput_figures(
    outcome: GrpoOutcome, gate_stats: Mapping[str, Any], alloc: dict[str, Any], generated_tokens: int | None
) -> dict[str, Any]:
    """The gate's quality and cost, occupancy, staleness, env steps and tokens."""
    counters = outcome.counters  # one set of counters (pipeline.counters.PhaseCounters)
    return {
        "gate_precision": gate_stats.get("gate/precision"),
        "gate_recall": gate_stats.get("gate/recall"),
        "gate_predictor": {k.removeprefix("gate/zv/"): v for k, v in gate_stats.items() if k.startswith("gate/zv/")},
        "gate_us_per_decision": gate_stats.get("gate/us_per_decision"),
        "gate_cpu_us_per_decision": gate_stats.get("gate/cpu_us_per_decision"),
        "slot_occupancy": outcome.slot_occupancy,
        "trajectory_slot_occupancy": outcome.trajectory_slot_occupancy,
        "staleness_lag_max": counters.staleness_lag_max,
        "staleness_lag_mean": counters.lag_sum / counters.items_trained if counters.items_trained else None,
        "items_dropped_stale": counters.items_dropped_stale,
        "items_beyond_max": counters.items_beyond_max,
        "items_trained": counters.items_trained,
        "env_steps": outcome.env_steps,
        "env_steps_per_s": outcome.env_steps / outcome.wall_s if outcome.wall_s > 0 else None,
        "rollouts_spent": alloc.get("allocator/rollouts_spent"),
        "trajectories_failed": outcome.rollout.trajectories_failed,
        "generated_tokens": generated_tokens,
        "learner_updates": counters.updates,
        # of uncut groups only: a gate cuts mostly failing ones, so with cuts this reads high
        "train_success_rate": counters.successes / counters.rollouts_finished if counters.rollouts_finished else None,
    }


def predictor_table(figures: Mapping[str, Any]) -> str:
    """The zero-variance gate's live figures on its unbiased sample (`summary["gate_predictor"]`), a row per
    checkpoint k (0 = admission): threshold, precision and recall with their 95 % Wilson intervals."""

    def cell(name: str, k: str) -> str:
        value, lo, hi = (figures.get(f"{name}{part}@{k}") for part in ("", "_lo", "_hi"))
        return "-" if value is None else f"{value:.2f} [{lo:.2f}, {hi:.2f}]"

    ks = sorted({int(key.rsplit("@", 1)[1]) for key in figures if key.startswith("threshold@")})
    lines = ["| k | threshold | flagged | precision [95 %] | recall [95 %] |", "|---|---|---|---|---|"]
    for k in map(str, ks):
        threshold = figures.get(f"threshold@{k}")
        lines.append(f"| {k} | {'-' if threshold is None else f'{threshold:.3f}'} | {figures.get(f'flagged@{k}', 0)} "
                     f"| {cell('precision', k)} | {cell('recall', k)} |")
    return "\n".join(lines)
