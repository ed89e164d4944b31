"""The default job, end to end: warm start -> held-out success -> GRPO with the gate -> held-out again.

This is the composition root: it resolves every configured name through the registries (environment,
policy backend, gate, allocator, loss, custom stages), builds the components, runs the phases and writes
the run folder. Everything it builds is also usable on its own (see docs/architecture.md).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
import trio

from gates import GATES
from gates.allocators import AllocatorContext, build_allocator, check_allocator
from learner.losses import LOSSES
from learner.trainer import Trainer
from stages.envs import ENVS, EnvSuite, Task
from stages.evaluate import EvalReport, evaluate
from stages.policy import POLICIES, Policy

from .config import RunConfig, load_config
from .grpo import GrpoOutcome, run_grpo
from .profiling import Profiler
from .progress import Progress
from .rundir import MetricsWriter, configure_logging, create_run_dir, write_summary
from .stage import STAGES, build_stage

log = structlog.get_logger(__name__)


def name_checks(cfg: RunConfig) -> list[str]:
    """Every configured name that does not resolve, for `load_config(extra_checks=...)`."""
    problems = ENVS.check(cfg.env.name, "env.name")
    policy_problems = POLICIES.check(cfg.policy.backend, "policy.backend")
    if not policy_problems:  # a backend may validate its own section (`build.check`): vllm's install, model
        policy_problems = getattr(POLICIES.get(cfg.policy.backend), "check", lambda _: [])(cfg.policy)
    problems += policy_problems
    problems += GATES.check(cfg.gate.name, "gate.name")
    problems += LOSSES.check(cfg.learner.loss, "learner.loss")
    problems += [f"allocator: {p}" for p in check_allocator(cfg.allocator.name, cfg.allocator.options)]
    for i, spec in enumerate(cfg.stages):
        problems += STAGES.check(spec.target, f"stages[{i}].target")
    if cfg.gate.k > cfg.env.max_steps:
        problems.append(f"gate.k ({cfg.gate.k}) is beyond env.max_steps ({cfg.env.max_steps}): the gate could never fire")
    return problems


def load(path: str | Path | None, overrides: Sequence[str]) -> RunConfig:
    return load_config(path, overrides, extra_checks=[name_checks])


def build_suite(cfg: RunConfig) -> EnvSuite:
    return ENVS.get(cfg.env.name)(max_steps=cfg.env.max_steps, **cfg.env.options)


def build_policy(cfg: RunConfig, suite: EnvSuite) -> Policy:
    return POLICIES.get(cfg.policy.backend)(cfg.policy, cfg.pretrain, suite, seed=cfg.run.seed)


def heldout_tasks(cfg: RunConfig, suite: EnvSuite) -> dict[str, list[Task]]:
    return {split: list(suite.tasks(split))[: cfg.eval.tasks] for split in cfg.eval.splits} if cfg.eval.tasks else {}


async def evaluate_heldout(policy: Policy, suite: EnvSuite, splits: dict[str, list[Task]], greedy: bool) -> dict[str, EvalReport]:
    reports = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        for split, tasks in splits.items():
            reports[split] = await evaluate(policy, suite, tasks, greedy=greedy)
        nursery.cancel_scope.cancel("evaluation finished")
    return reports


@dataclass
class JobResult:
    run_dir: Path
    summary: dict[str, Any]
    outcome: GrpoOutcome


async def run_job(cfg: RunConfig, *, progress: Progress | None = None) -> JobResult:
    """Run the whole job; the run folder is created first so even a failed run leaves its events."""
    wall_started = time.perf_counter()
    run_dir = create_run_dir(cfg)
    events_file = configure_logging(run_dir)
    progress = progress or Progress(cfg.run.updates, enabled=cfg.run.progress)
    progress.message(f"rollcut: run folder {run_dir}")
    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    torch.set_num_threads(cfg.run.torch_threads)
    policy: Policy | None = None
    try:
        suite = build_suite(cfg)
        progress.message(f"warm start: {cfg.policy.backend} policy on {cfg.env.name} (cached after first use)")
        t0 = time.perf_counter()
        policy = await trio.to_thread.run_sync(build_policy, cfg, suite)
        warm_start_s = time.perf_counter() - t0
        splits = heldout_tasks(cfg, suite)
        before = await evaluate_heldout(policy, suite, splits, cfg.eval.greedy)
        progress.message("held-out success before GRPO: " + _fmt_eval(before))

        train = list(suite.tasks("train"))
        if cfg.env.train_tasks:
            train = train[: cfg.env.train_tasks]
        allocator = build_allocator(
            cfg.allocator.name,
            cfg.allocator.options,
            AllocatorContext(tasks=train, group_size=cfg.rollout.group_size, batch_groups=cfg.learner.batch_groups, seed=cfg.run.seed),
        )
        trainer = Trainer(policy.trainable(), cfg.learner, LOSSES.get(cfg.learner.loss), seed=cfg.run.seed)
        observers = [build_stage(spec.target, spec.options) for spec in cfg.stages]
        profiler = Profiler.from_config(cfg.profile, thread_cpu=cfg.profile.thread_cpu, gpu_stages=cfg.profile.gpu_stages)
        metrics = MetricsWriter(run_dir)
        progress.message(
            f"GRPO: {cfg.run.updates} updates x {cfg.learner.batch_groups} groups, G={cfg.rollout.group_size}, "
            f"gate {'on' if cfg.gate.enabled else 'off'}{' (shadow)' if cfg.gate.enabled and cfg.gate.shadow else ''}, "
            f"allocator {cfg.allocator.name}"
        )
        async with profiler.sampling():
            outcome = await run_grpo(
                cfg, suite=suite, policy=policy, tasks={t.task_id: t for t in train}, allocator=allocator,
                trainer=trainer, run_dir=run_dir, profiler=profiler, metrics=metrics, observers=observers,
                progress=progress,
            )
        metrics.close()
        report = profiler.finish()
        profiler.write(run_dir)
        overhead = profiler.overhead_estimate() if profiler.enabled else None
        after = await evaluate_heldout(policy, suite, splits, cfg.eval.greedy)
        progress.message("held-out success after GRPO:  " + _fmt_eval(after))
        _save_checkpoints(run_dir, trainer, allocator)
        summary = _summary(cfg, outcome, before, after, warm_start_s, time.perf_counter() - wall_started,
                           profiler_overhead_pct=overhead["overhead_pct"] if overhead else None)
        write_summary(run_dir, summary, {"Per-stage profile": report.table_markdown(), "Held-out success by family": _family_table(before, after)})
        log.info("job.finished", **{k: v for k, v in summary.items() if not isinstance(v, dict | list)})
        return JobResult(run_dir, summary, outcome)
    finally:
        close = getattr(policy, "close", None)  # optional: a backend holding an engine (vllm) shuts it down
        if close is not None:
            with trio.CancelScope(shield=True):  # even on Ctrl-C: no engine process is left behind
                await trio.to_thread.run_sync(close)
        if events_file is not None:
            configure_logging(None)  # later events (another job, a test) must not write to the closed file
            events_file.close()


def _fmt_eval(reports: dict[str, EvalReport]) -> str:
    return ", ".join(f"{split} {r.success:.1%} ({len(r.episodes)} tasks)" for split, r in reports.items()) or "skipped (eval.tasks = 0)"


def _family_table(before: dict[str, EvalReport], after: dict[str, EvalReport]) -> str:
    lines = ["| split | family | before | after |", "|---|---|---|---|"]
    for split, report in before.items():
        for family, value in sorted(report.per_family.items()):
            lines.append(f"| {split} | {family} | {value:.1%} | {after[split].per_family.get(family, float('nan')):.1%} |")
    return "\n".join(lines)


def _mean_success(reports: dict[str, EvalReport]) -> float | None:
    episodes = [e for r in reports.values() for e in r.episodes]
    return sum(e.won for e in episodes) / len(episodes) if episodes else None


def _summary(
    cfg: RunConfig, outcome: GrpoOutcome, before: dict[str, EvalReport], after: dict[str, EvalReport], warm_start_s: float, wall_s: float,
    *, profiler_overhead_pct: float | None,
) -> dict[str, Any]:
    tally, learner = outcome.tally, outcome.learner.counters
    gate_stats = outcome.gate.statistics() if outcome.gate is not None else {}
    alloc = dict(outcome.allocator.statistics())
    return {
        "seed": cfg.run.seed,
        "gate": f"{cfg.gate.name} K={cfg.gate.k} tau={cfg.gate.tau}" + (" shadow" if cfg.gate.shadow else "") if cfg.gate.enabled else "off",
        "allocator": cfg.allocator.name,
        "stop_reason": outcome.stop_reason,
        "groups_admitted": outcome.admission.groups_admitted,
        "groups_cut": tally.groups_cut,
        "groups_backfilled": outcome.admission.backfills,
        "groups_trained": learner.groups_trained,
        "groups_dropped_zero_variance": learner.groups_dropped_zero_variance,
        "cut_groups_reaching_learner": learner.cut_groups_refused + tally.cut_emission_refused,
        "zero_variance_fraction": tally.zero_variance_complete / tally.groups_complete if tally.groups_complete else None,
        "groups_all_fail": tally.all_fail_complete,
        "groups_mixed": tally.groups_complete - tally.all_fail_complete - tally.all_succeed_complete,
        "groups_all_succeed": tally.all_succeed_complete,
        "gate_precision": gate_stats.get("gate/precision"),
        "gate_recall": gate_stats.get("gate/recall"),
        "gate_us_per_decision": gate_stats.get("gate/us_per_decision"),
        "gate_cpu_us_per_decision": gate_stats.get("gate/cpu_us_per_decision"),
        "slot_occupancy": outcome.slot_occupancy,
        "env_steps": outcome.env_steps,
        "env_steps_per_s": outcome.env_steps / outcome.wall_s if outcome.wall_s > 0 else None,
        "rollouts_spent": alloc.get("allocator/rollouts_spent"),
        "trajectories_failed": outcome.rollout.trajectories_failed,
        "learner_updates": learner.updates,
        "train_success_rate": tally.successes / tally.rollouts_finished if tally.rollouts_finished else None,
        "heldout_success_before": _mean_success(before),
        "heldout_success_after": _mean_success(after),
        "heldout_before": {s: r.success for s, r in before.items()},
        "heldout_after": {s: r.success for s, r in after.items()},
        "loop_lag_p99_ms": outcome.loop_lag_p99_ms(),
        "profiler_overhead_pct": profiler_overhead_pct,
        "warm_start_s": warm_start_s,
        "grpo_wall_s": outcome.wall_s,
        "wall_s": wall_s,
        "allocator_stats": alloc,
    }


def _save_checkpoints(run_dir: Path, trainer: Trainer, allocator: Any) -> None:
    torch.save(trainer.model.state_dict(), run_dir / "checkpoints" / "policy.pt")
    (run_dir / "checkpoints" / "allocator.json").write_text(json.dumps(allocator.state_dict()))
