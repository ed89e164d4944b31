"""The default job, end to end: warm start -> held-out success -> GRPO with the gate -> held-out again.

This is the composition root: it resolves every configured name through the registries (environment,
policy backend, gate, allocator, loss, custom stages), builds the components, runs the phases and writes
the run folder. Everything it builds is also usable on its own (see docs/architecture.md).
"""

from __future__ import annotations

import errno
import json
import random
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import structlog
import torch
import trio

from gates import GATES
from gates.allocators import AllocatorContext, build_allocator, check_allocator
from learner.aggregation import AGGREGATIONS
from learner.losses import LOSSES
from learner.trainer import Trainer
from stages.envs import ENVS, EnvSuite, Task
from stages.evaluate import EpisodeOutcome, EvalReport, evaluate_splits, summarize
from stages.policy import POLICIES, Policy
from stages.policy.workers import WorkerPoolPolicy

from . import resume
from .config import RunConfig, dump_toml, load_config
from .curves import curve_points, write_learning_curve
from .grpo import GrpoOutcome, run_grpo
from .memory import peak_rss_mb, tune_malloc
from .profiling import Profiler
from .progress import Progress
from .rundir import MetricsWriter, configure_logging, create_run_dir, write_summary
from .stage import STAGES, StageFailed, build_stage

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
    problems += AGGREGATIONS.check(cfg.learner.aggregation, "learner.aggregation")
    problems += [f"allocator: {p}" for p in check_allocator(cfg.allocator.name, cfg.allocator.options)]
    for i, spec in enumerate(cfg.stages):
        problems += STAGES.check(spec.target, f"stages[{i}].target")
    if cfg.gate.k > cfg.env.max_steps:
        problems.append(f"gate.k ({cfg.gate.k}) is beyond env.max_steps ({cfg.env.max_steps}): the gate could never fire")
    return problems + (build_checks(cfg) if not problems else [])


_BUILD_ERRORS = (TypeError, ValueError, LookupError, OSError, ImportError)


def build_checks(cfg: RunConfig) -> list[str]:
    """Build every plugin with its options (cheap constructors, no warm start) so a bad option or a missing
    games folder fails `run.py check` and the start of `run.py` with exit 2, not a traceback after the warm
    start. A policy backend may offer `check_options(policy_section) -> list[str]` for its options."""
    problems: list[str] = []

    def attempt(where: str, build: Any) -> None:
        try:
            build()
        except _BUILD_ERRORS as exc:
            problems.append(f"{where}: {exc}")

    if cfg.gate.enabled:
        gate_cls = GATES.get(cfg.gate.name)
        attempt("gate.options", lambda: gate_cls(k=cfg.gate.k, tau=cfg.gate.tau, checkpoints=cfg.gate.checkpoints, **cfg.gate.options))
    attempt("env", lambda: build_suite(cfg))
    check_policy = getattr(POLICIES.get(cfg.policy.backend), "check_options", None)
    if check_policy is not None:
        problems += [f"policy.options: {p}" for p in check_policy(cfg.policy)]
    for i, spec in enumerate(cfg.stages):
        attempt(f"stages[{i}]", lambda spec=spec: build_stage(spec.target, spec.options))
    return problems


def load(path: str | Path | None, overrides: Sequence[str]) -> RunConfig:
    return load_config(path, overrides, extra_checks=[name_checks])


def build_suite(cfg: RunConfig) -> EnvSuite:
    return ENVS.get(cfg.env.name)(max_steps=cfg.env.max_steps, **cfg.env.options)


def build_policy(cfg: RunConfig, suite: EnvSuite, *, workers: int | None = None) -> Policy:
    """The configured backend, warm-started; behind a pool of decoding processes when `policy.workers` > 1."""
    local = POLICIES.get(cfg.policy.backend)(cfg.policy, cfg.pretrain, suite, seed=cfg.run.seed)
    workers = cfg.policy.workers if workers is None else workers
    if workers <= 1:
        return local
    return WorkerPoolPolicy(local, dump_toml(cfg), workers=workers, weights=local.trainable().state_dict())


def heldout_tasks(cfg: RunConfig, suite: EnvSuite) -> dict[str, list[Task]]:
    """The first `eval.tasks` of each eval split; an empty split is left out with a warning (not "0.0%")."""
    if not cfg.eval.tasks:
        return {}
    splits = {split: list(suite.tasks(split))[: cfg.eval.tasks] for split in cfg.eval.splits}
    for split in [s for s, tasks in splits.items() if not tasks]:
        log.warning("eval.empty_split", split=split, env=cfg.env.name, note="this split has no tasks: its success is not measured")
        del splits[split]
    return splits


async def evaluate_heldout(policy: Policy, suite: EnvSuite, splits: dict[str, list[Task]], greedy: bool) -> dict[str, EvalReport]:
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        reports = await evaluate_splits(policy, suite, splits, greedy=greedy)  # all splits' episodes at once
        nursery.cancel_scope.cancel("evaluation finished")
    return reports


def _periodic_evaluator(cfg: RunConfig, suite: EnvSuite, splits: dict[str, list[Task]]) -> Any:
    """`evaluate(version, weights)` for the GRPO phase: a second policy of the same backend (the cached
    warm start), loaded with exactly that version's weights, so the figure is that version's whatever the
    live policy loads meanwhile."""
    holder: list[Policy] = []
    one_at_a_time = trio.Lock()  # one evaluation policy: evaluations that overlap (small eval.every) take turns

    async def evaluate_version(version: int, state: Any) -> dict[str, float]:
        async with one_at_a_time:
            if not holder:
                holder.append(await trio.to_thread.run_sync(lambda: build_policy(cfg, suite, workers=1)))
            policy = holder[0]
            policy.load_weights(version, state)
            reports = await evaluate_heldout(policy, suite, splits, cfg.eval.greedy)
        scores = {split.removeprefix("heldout_"): r.success for split, r in reports.items()}
        mean = _mean_success(reports)
        return scores | ({"mean": mean} if mean is not None else {})

    return evaluate_version


@dataclass
class JobResult:
    run_dir: Path
    summary: dict[str, Any]
    outcome: GrpoOutcome


class RunInterrupted(Exception):
    """Ctrl-C / SIGTERM stopped the run; `version` is the update its checkpoint holds (None: none yet)."""

    def __init__(self, run_dir: Path, version: int | None) -> None:
        self.run_dir, self.version = run_dir, version
        saved = f"checkpoint at update {version} written" if version is not None else "no update finished yet"
        super().__init__(f"interrupted; {saved}; continue with `python run.py resume {run_dir}`")


class RunFailed(Exception):
    """A stage failed; the message says which and what, and where the checkpoint is."""


async def run_job(
    cfg: RunConfig, *, progress: Progress | None = None, resume_dir: Path | None = None, stop: trio.Event | None = None
) -> JobResult:
    """Run the whole job (or continue the stopped one in `resume_dir`); the run folder is created first so
    even a failed run leaves its events. `stop` (Ctrl-C) ends it with a checkpoint: `RunInterrupted`."""
    wall_started = time.perf_counter()
    tune_malloc(arenas=cfg.run.malloc_arenas, fixed_mmap=cfg.run.flat_memory)  # before the model exists (pipeline/memory.py)
    run_dir = resume_dir if resume_dir is not None else create_run_dir(cfg)
    checkpoint = resume.load_state(run_dir) if resume_dir is not None else None
    if resume_dir is not None:
        resume.trim_metrics(run_dir, checkpoint["version"] if checkpoint else 0)
        resume.atomic_write_text(run_dir / "config.toml", dump_toml(cfg))
    events_file = configure_logging(run_dir)
    progress = progress or Progress(cfg.run.updates, enabled=cfg.run.progress)
    progress.activate()  # the warm start and held-out evaluations report through it
    progress.message(f"rollcut: run folder {run_dir}" + (f" (resumed at update {checkpoint['version']})" if checkpoint else ""))
    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    torch.set_num_threads(cfg.run.torch_threads)
    policy: Policy | None = None
    try:
        return await _run_phases(cfg, run_dir, checkpoint, progress, stop if stop is not None else trio.Event(), wall_started)
    finally:
        close = getattr(policy, "close", None)  # optional: a backend holding an engine (vllm) shuts it down
        if close is not None:
            with trio.CancelScope(shield=True):  # even on Ctrl-C: no engine process is left behind
                await trio.to_thread.run_sync(close)
        if events_file is not None:
            configure_logging(None)  # later events (another job, a test) must not write to the closed file
            events_file.close()


async def _run_phases(
    cfg: RunConfig, run_dir: Path, checkpoint: dict[str, Any] | None, progress: Progress, stop: trio.Event, wall_started: float
) -> JobResult:
    job = dict(checkpoint["job"]) if checkpoint else {}
    suite = build_suite(cfg)
    splits = heldout_tasks(cfg, suite)
    policy, warm_start_s = await _unless_stopped(stop, run_dir, _build_policy, cfg, suite, checkpoint)
    if "heldout_before" in job:
        before = _reports_from_json(job["heldout_before"])
    else:
        before = await _unless_stopped(stop, run_dir, evaluate_heldout, policy, suite, splits, cfg.eval.greedy)
        job |= {"heldout_before": _reports_to_json(before), "warm_start_s": warm_start_s, "job_wall_s": 0.0}
    progress.message("held-out success before GRPO: " + _fmt_eval(before))

    train = list(suite.tasks("train"))
    if cfg.env.train_tasks:
        train = train[: cfg.env.train_tasks]
    allocator = build_allocator(
        cfg.allocator.name,
        cfg.allocator.options,
        AllocatorContext(tasks=train, group_size=cfg.rollout.group_size, batch_groups=cfg.learner.batch_groups, seed=cfg.run.seed),
    )
    trainer = Trainer(
        policy.trainable(), cfg.learner, LOSSES.get(cfg.learner.loss),
        temperature=cfg.policy.temperature, top_p=cfg.policy.top_p, seed=cfg.run.seed,
    )
    if checkpoint is not None:
        allocator.load_state_dict(checkpoint["allocator"])
        trainer.load_state_dict(checkpoint["trainer"])
        resume.set_rng_state(checkpoint["rng"])
    observers = [build_stage(spec.target, spec.options) for spec in cfg.stages]
    profiler = Profiler.from_config(cfg.profile, thread_cpu=cfg.profile.thread_cpu, gpu_stages=cfg.profile.gpu_stages)
    metrics = MetricsWriter(run_dir)
    checkpointer = resume.Checkpointer(run_dir, cfg.run.checkpoint_every, job)
    checkpointer.latest = checkpoint
    checkpointer.written_version = checkpoint["version"] if checkpoint else None
    progress.message(
        f"GRPO: {cfg.run.updates} updates x {cfg.learner.batch_groups} groups, G={cfg.rollout.group_size}, "
        f"gate {'on' if cfg.gate.enabled else 'off'}{' (shadow)' if cfg.gate.enabled and cfg.gate.shadow else ''}, "
        f"allocator {cfg.allocator.name}"
    )
    checkpointer.job["job_wall_s"] = job["job_wall_s"] + (time.perf_counter() - wall_started)  # wall outside GRPO
    tokens_before = _generated_tokens(policy)
    try:
        async with profiler.sampling():
            outcome = await run_grpo(
                cfg, suite=suite, policy=policy, tasks={t.task_id: t for t in train}, allocator=allocator,
                trainer=trainer, run_dir=run_dir, profiler=profiler, metrics=metrics, observers=observers,
                progress=progress, checkpointer=checkpointer, restore=checkpoint["grpo"] if checkpoint else None, stop=stop,
                evaluate=_periodic_evaluator(cfg, suite, splits) if cfg.eval.every and splits else None,
            )
    except Exception as exc:
        raise RunFailed(failure_message(exc, run_dir, _save_on_failure(checkpointer))) from exc
    finally:
        metrics.close()
    tokens_after = _generated_tokens(policy)
    generated = tokens_after - tokens_before if tokens_before is not None and tokens_after is not None else None
    version = checkpointer.write()
    grpo_ended = time.perf_counter()
    report = profiler.finish()
    profiler.write(run_dir)
    interrupted = outcome.stop_reason == "interrupted"
    overhead = profiler.overhead_estimate() if profiler.enabled and not interrupted else None  # ~2 s of probing
    after = {} if interrupted else await _unless_stopped(stop, run_dir, evaluate_heldout, policy, suite, splits, cfg.eval.greedy, version=version)
    if not interrupted:
        progress.message("held-out success after GRPO:  " + _fmt_eval(after))
        _save_checkpoints(run_dir, trainer, allocator)
    wall_s = checkpointer.job["job_wall_s"] + outcome.wall_s + (time.perf_counter() - grpo_ended)
    summary = _summary(cfg, outcome, before, after, job["warm_start_s"], wall_s,
                       profiler_overhead_pct=overhead["overhead_pct"] if overhead else None, generated_tokens=generated)
    if outcome.tally.evaluations:
        write_learning_curve(
            run_dir / "learning_curve.png",
            curve_points({s: r.success for s, r in before.items()}, outcome.tally.evaluations,
                         {s: r.success for s, r in after.items()}, final_wall_s=outcome.wall_s, final_env_steps=outcome.env_steps),
            title=f"{cfg.run.name}: held-out success (seed {cfg.run.seed})",
        )
    write_summary(run_dir, summary, {"Per-stage profile": report.table_markdown(), "Held-out success by family": _family_table(before, after)})
    log.info("job.finished", **{k: v for k, v in summary.items() if not isinstance(v, dict | list)})
    if interrupted:
        raise RunInterrupted(run_dir, version)
    return JobResult(run_dir, summary, outcome)


async def _build_policy(cfg: RunConfig, suite: EnvSuite, checkpoint: dict[str, Any] | None) -> tuple[Policy, float]:
    """The warm-started policy, or (resuming) the checkpoint's weights with no warm start at all."""
    t0 = time.perf_counter()
    if checkpoint is None:
        policy = await trio.to_thread.run_sync(build_policy, cfg, suite, abandon_on_cancel=True)
        return policy, time.perf_counter() - t0
    cold = msgspec.structs.replace(cfg, pretrain=msgspec.structs.replace(cfg.pretrain, enabled=False))
    policy = await trio.to_thread.run_sync(build_policy, cold, suite, abandon_on_cancel=True)
    policy.load_weights(checkpoint["version"], checkpoint["trainer"]["model"])
    load_sampling = getattr(policy, "load_sampling_state", None)
    if load_sampling is not None and checkpoint["policy"] is not None:
        load_sampling(checkpoint["policy"])
    return policy, time.perf_counter() - t0


async def _unless_stopped(stop: trio.Event, run_dir: Path, fn: Any, *args: Any, version: int | None = None) -> Any:
    """`await fn(*args)`, cancelled by `stop` (then `RunInterrupted`)."""
    result = None
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await stop.wait()
            nursery.cancel_scope.cancel("interrupted")

        nursery.start_soon(watch)
        result = await fn(*args)
        nursery.cancel_scope.cancel()
    if stop.is_set():
        raise RunInterrupted(run_dir, version)
    return result


def _save_on_failure(checkpointer: resume.Checkpointer) -> str:
    try:
        version = checkpointer.write()
    except OSError as exc:
        return f"the checkpoint could not be written either ({exc}); the previous one, if any, is intact"
    return f"checkpoint at update {version} kept" if version is not None else "no update had finished (no checkpoint)"


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def failure_message(exc: BaseException, run_dir: Path, saved: str) -> str:
    """One readable paragraph: which stage failed (by the file that raised), what, and what to do."""
    lines = []
    for leaf in _leaves(exc):
        if isinstance(leaf, StageFailed):  # the stage said what went wrong
            lines.append(str(leaf))
            continue
        if isinstance(leaf, OSError) and leaf.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            lines.append(f"the disk of the run folder is full ({leaf.strerror}{': ' + str(leaf.filename) if leaf.filename else ''})")
            continue
        frames = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno}"
                  for f in reversed(traceback.extract_tb(leaf.__traceback__))
                  if "/site-packages/" not in f.filename and "/lib/python" not in f.filename]  # innermost first
        stage = next((s for s in map(_stage_of, frames) if s is not None), "the run")
        lines.append(f"{stage} failed: {type(leaf).__name__}: {leaf} (at {frames[0] if frames else '?'})")
    return "; ".join(lines) + f". {saved}; after fixing it, continue with `python run.py resume {run_dir}`"


def _stage_of(where: str) -> str | None:
    for fragment, stage in (("learner/", "the learner"), ("torch_tiny/", "the policy server"), ("gate", "the gate stage"),
                            ("rollout", "the rollout stage"), ("envs/", "the environment"), ("allocators/", "the allocator")):
        if where.startswith(fragment) or f"/{fragment}" in where or fragment in where.split(":")[0]:
            return stage
    return None


def _fmt_eval(reports: dict[str, EvalReport]) -> str:
    return ", ".join(f"{split} {r.success:.1%} ({len(r.episodes)} tasks)" for split, r in reports.items()) or "skipped (eval.tasks = 0)"


def _family_table(before: dict[str, EvalReport], after: dict[str, EvalReport]) -> str:
    lines = ["| split | family | before | after |", "|---|---|---|---|"]
    for split, report in before.items():
        for family, value in sorted(report.per_family.items()):
            lines.append(f"| {split} | {family} | {value:.1%} | {after[split].per_family.get(family, float('nan')) if split in after else float('nan'):.1%} |")
    return "\n".join(lines)


def _mean_success(reports: dict[str, EvalReport]) -> float | None:
    episodes = [e for r in reports.values() for e in r.episodes]
    return sum(e.won for e in episodes) / len(episodes) if episodes else None


def _summary(
    cfg: RunConfig, outcome: GrpoOutcome, before: dict[str, EvalReport], after: dict[str, EvalReport], warm_start_s: float, wall_s: float,
    *, profiler_overhead_pct: float | None, generated_tokens: int | None = None,
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
        "zero_variance_fraction": tally.merged_zero_variance / tally.merged_full_size if tally.merged_full_size else None,
        "zero_variance_prompts": tally.merged_full_size,
        "first_stage_groups": tally.first_stage_groups,
        "first_stage_cut_fraction": tally.first_stage_cut / tally.first_stage_groups if tally.first_stage_groups else None,
        "gate_decisions_by_kind": {k.rsplit("/", 1)[1]: v for k, v in gate_stats.items() if k.startswith("gate/decisions/")},
        "gate_groups_seen_by_kind": {k.rsplit("/", 1)[1]: v for k, v in gate_stats.items() if k.startswith("gate/groups_seen/")},
        "cuts_late": outcome.rollout.cuts_late + tally.cancels_late,
        "groups_all_fail": tally.all_fail_complete,
        "groups_mixed": tally.groups_complete - tally.all_fail_complete - tally.all_succeed_complete,
        "groups_all_succeed": tally.all_succeed_complete,
        "gate_precision": gate_stats.get("gate/precision"),
        "gate_recall": gate_stats.get("gate/recall"),
        "gate_us_per_decision": gate_stats.get("gate/us_per_decision"),
        "gate_cpu_us_per_decision": gate_stats.get("gate/cpu_us_per_decision"),
        "slot_occupancy": outcome.slot_occupancy,
        "trajectory_slot_occupancy": outcome.trajectory_slot_occupancy,
        "staleness_lag_max": tally.staleness_lag_max,
        "staleness_lag_mean": tally.lag_sum / tally.items_trained if tally.items_trained else None,
        "items_dropped_stale": tally.items_dropped_stale,
        "items_trained": tally.items_trained,
        "env_steps": outcome.env_steps,
        "env_steps_per_s": outcome.env_steps / outcome.wall_s if outcome.wall_s > 0 else None,
        "rollouts_spent": alloc.get("allocator/rollouts_spent"),
        "trajectories_failed": outcome.rollout.trajectories_failed,
        "generated_tokens": generated_tokens,
        "learner_updates": learner.updates,
        "train_success_rate": tally.successes / tally.rollouts_finished if tally.rollouts_finished else None,
        "heldout_success_before": _mean_success(before),
        "heldout_success_after": _mean_success(after),
        "heldout_before": {s: r.success for s, r in before.items()},
        "heldout_after": {s: r.success for s, r in after.items()},
        "heldout_tasks_per_split": cfg.eval.tasks,
        "heldout_curve": tally.evaluations,
        "eval_s": tally.eval_s,
        "loop_lag_p99_ms": outcome.loop_lag_p99_ms(),
        "profiler_overhead_pct": profiler_overhead_pct,
        "warm_start_s": warm_start_s,
        "grpo_wall_s": outcome.wall_s,
        "wall_s": wall_s,
        "allocator_stats": alloc,
        "peak_rss_mb": peak_rss_mb(),
        "dropped_frames_total": sum(n for counts in outcome.dropped_frames.values() for n in counts.values()),
        "dropped_frames": outcome.dropped_frames,
    }


def _generated_tokens(policy: Policy) -> int | None:
    """Tokens the policy generated so far, if the backend counts them (`statistics().generated_tokens`)."""
    stats = getattr(policy, "statistics", None)
    return getattr(stats(), "generated_tokens", None) if stats is not None else None


def _save_checkpoints(run_dir: Path, trainer: Trainer, allocator: Any) -> None:
    resume.atomic_write(run_dir / "checkpoints" / "policy.pt", lambda f: torch.save(trainer.model.state_dict(), f))
    resume.atomic_write_text(run_dir / "checkpoints" / "allocator.json", json.dumps(allocator.state_dict()))


def _reports_to_json(reports: dict[str, EvalReport]) -> dict[str, list[list[Any]]]:
    return {split: [[e.task_id, e.family, e.won, e.steps] for e in r.episodes] for split, r in reports.items()}


def _reports_from_json(data: dict[str, list[list[Any]]]) -> dict[str, EvalReport]:
    return {split: summarize([EpisodeOutcome(*row) for row in rows]) for split, rows in data.items()}
