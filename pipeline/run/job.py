"""The default job, end to end: warm start -> held-out success -> GRPO with the gate -> held-out again.

Where a run starts (`python run.py`): the config was checked (`checks.py`), the components are built
(`build.py`, the one builder), the phases run here and in `grpo.py`, and the run folder is written. Everything
it builds is also usable on its own (see docs/architecture.md).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import structlog
import torch
import trio

from learner.trainer import Trainer, published_weights
from pipeline.config import RunConfig, dump_toml
from pipeline.ledger import ledger_table
from pipeline.machine_load import watching
from pipeline.memory import frozen_heap, peak_rss_mb, trim, tune_malloc
from pipeline.profiling import Profiler
from pipeline.progress import Progress
from pipeline.provenance import invocations, record_invocation
from pipeline.rundir import MetricsWriter, configure_logging, create_run_dir, write_summary
from pipeline.trackers import Trackers, finish_run, open_run_trackers
from stages.envs import EnvSuite, Task
from stages.evaluate import EvalReport
from stages.policy import Policy

from . import before_cache, build, offclock, resume
from .build import cluster, train_tasks
from .failure import failure_message, save_on_failure
from .grpo import GrpoOutcome, run_grpo
from .heldout import Evaluate, curve_tasks, evaluate_heldout, heldout_tasks, periodic_evaluator
from .learning_curve import curve_points, write_learning_curve
from .loop_watch import blockers_table
from .parts import RunParts
from .runtime import gil_switch_interval
from .summary import (
    family_table,
    fmt_change,
    fmt_eval,
    group_kinds_table,
    policy_figures,
    predictor_table,
    reports_from_json,
    reports_to_json,
    summary,
    write_episodes,
)
from .teardown import build_in_thread

log = structlog.get_logger(__name__)


@dataclass
class JobResult:
    run_dir: Path
    summary: dict[str, Any]
    outcome: GrpoOutcome

    @property
    def summary_md(self) -> str:
        return (self.run_dir / "summary.md").read_text()


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
    even a failed run leaves its events. `stop` (Ctrl-C) ends it with a checkpoint: `RunInterrupted`. On Ray the
    process joins the cluster first, so a cluster that is not there is `RunRefused` before any run folder exists."""
    wall_started = time.perf_counter()
    tune_malloc(arenas=cfg.run.malloc_arenas, fixed_mmap=cfg.run.flat_memory)  # before the model exists (pipeline/memory.py)
    async with cluster(cfg):  # on Ray: joined for the whole job (`placement.address`)
        return await _run_job_joined(cfg, progress, resume_dir, stop, wall_started)


async def _run_job_joined(cfg: RunConfig, progress: Progress | None, resume_dir: Path | None, stop: trio.Event | None,
                          wall_started: float) -> JobResult:
    run_dir = resume_dir if resume_dir is not None else create_run_dir(cfg)
    checkpoint = resume.load_state(run_dir) if resume_dir is not None else None
    if resume_dir is not None:
        resume.trim_metrics(run_dir, checkpoint["version"] if checkpoint else 0)
        resume.atomic_write_text(run_dir / "config.toml", dump_toml(cfg))
    record_invocation(run_dir, resumed=resume_dir is not None)  # appended, never overwritten (pipeline/provenance.py)
    events_file = configure_logging(run_dir)
    progress = progress or Progress(cfg.run.updates, enabled=cfg.run.progress)
    progress.activate()  # the warm start and held-out evaluations report through it
    progress.message(f"rollcut: run folder {run_dir}" + (f" (resumed at update {checkpoint['version']})" if checkpoint else ""))
    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    torch.set_num_threads(cfg.run.torch_threads)
    built: list[Policy] = []  # every policy the job builds (the live one, the held-out evaluator's)
    trackers, started, finished = Trackers(), time.time(), False
    try:
        trackers = _open_trackers(cfg, run_dir, checkpoint if resume_dir is not None else None, resumed=resume_dir is not None)
        result = await _run_phases(cfg, run_dir, checkpoint, progress, stop if stop is not None else trio.Event(), wall_started,
                                   built, trackers=trackers)
        finished = True
        return result
    finally:
        finish_run(trackers, run_dir, since=started, ok=finished)  # the summary and images, if written; then close
        with trio.CancelScope(shield=True):  # even on Ctrl-C or a failure: no engine process is left behind
            await _close_policies(built)
        if events_file is not None:
            configure_logging(None)  # later events (another job, a test) must not write to the closed file
            events_file.close()


def _open_trackers(cfg: RunConfig, run_dir: Path, checkpoint: dict[str, Any] | None, *, resumed: bool) -> Trackers:
    """`run.trackers`, opened before the warm start (a resumed run reopens the same tracker runs)."""
    try:
        return open_run_trackers(cfg, run_dir, resume_step=(checkpoint["version"] if checkpoint else 0) if resumed else None)
    except Exception as exc:
        raise RunFailed(f"a tracker of run.trackers could not start: {type(exc).__name__}: {exc}") from exc


async def _close_policies(policies: list[Policy]) -> None:
    """`close()` each policy (a no-op unless the backend holds something: vllm's engine); a
    close that fails is logged and the others still run."""
    for policy in policies:
        try:
            await trio.to_thread.run_sync(policy.close)
        except Exception as exc:
            log.warning("policy.close_failed", error=f"{type(exc).__name__}: {exc}")


async def _run_phases(
    cfg: RunConfig, run_dir: Path, checkpoint: dict[str, Any] | None, progress: Progress, stop: trio.Event, wall_started: float,
    built: list[Policy], *, trackers: Trackers,
) -> JobResult:
    job = dict(checkpoint["job"]) if checkpoint else {}
    suite = build.suite(cfg)
    splits = heldout_tasks(cfg, suite)
    policy, warm_start_s = await _unless_stopped(stop, run_dir, _build_policy, cfg, suite, checkpoint, built)
    _mark_peak(job, "build")
    if "heldout_before" in job and job.get("heldout_range", "dev") == cfg.eval.range:
        before = reports_from_json(job["heldout_before"])
    else:  # a new run, or a resume told to measure another range: the before measure of this one
        before, reused = await _unless_stopped(stop, run_dir, _measure_before, cfg, run_dir, policy, suite, splits,
                                               checkpoint is None)
        job |= {"heldout_before": reports_to_json(before), "heldout_range": cfg.eval.range, "heldout_before_reused": reused,
                "heldout_before_version": checkpoint["version"] if checkpoint else 0,  # a resume's: its checkpoint's
                "warm_start_s": job.get("warm_start_s", warm_start_s), "job_wall_s": job.get("job_wall_s", 0.0)}
        _mark_peak(job, "before")
    of = f", version {job['heldout_before_version']}'s weights" if job.get("heldout_before_version") else ""
    progress.message(f"held-out success before GRPO ({cfg.eval.range}{of}): " + fmt_eval(before))
    curve = curve_tasks(cfg, suite)
    parts = _run_parts(cfg, run_dir, suite, policy, splits, checkpoint, job, progress, trackers,
                       evaluate=periodic_evaluator(cfg, suite, curve, built) if curve else None)
    checkpointer = _checkpointer(parts)
    try:
        progress.message(
            f"GRPO: {cfg.run.updates} updates x {cfg.learner.batch_groups} groups, G={cfg.rollout.group_size}, "
            f"gate {'on' if cfg.gate.enabled else 'off'}{' (shadow)' if cfg.gate.enabled and cfg.gate.shadow else ''}, "
            f"allocator {cfg.allocator.name}"
        )
        checkpointer.job["job_wall_s"] = job["job_wall_s"] + (time.perf_counter() - wall_started)  # wall outside GRPO
        tokens_before = policy.statistics().generated_tokens
        async with parts.profiler.sampling(), watching() as load:  # the machine's load while GRPO runs
            with frozen_heap(cfg.run.gc_freeze) as frozen, gil_switch_interval(cfg.run.gil_switch_ms):  # issue 60, item 13
                log.info("grpo.gc_frozen", objects=frozen)
                outcome = await run_grpo(parts, stop=stop)
        _mark_peak(checkpointer.job, "grpo")
    except Exception as exc:
        raise RunFailed(failure_message(exc, run_dir, save_on_failure(checkpointer))) from exc
    finally:
        parts.metrics.close()
    generated = policy.statistics().generated_tokens - tokens_before
    measured = _Measured(before, job["warm_start_s"], generated, load.figures())
    return await _finish(parts, outcome, measured, stop)


@dataclass(frozen=True)
class _Measured:
    """What the job measured around the GRPO phase, for its summary."""

    before: dict[str, EvalReport]
    """Held-out success before GRPO."""
    warm_start_s: float
    generated_tokens: int | None
    """Tokens the policy generated during the GRPO phase (None: the backend does not count them)."""
    machine_load: dict[str, Any] | None
    """The machine's load during the GRPO phase (`pipeline/machine_load.py`)."""


def _run_parts(
    cfg: RunConfig, run_dir: Path, suite: EnvSuite, policy: Policy, splits: dict[str, list[Task]],
    checkpoint: dict[str, Any] | None, job: dict[str, Any], progress: Progress, trackers: Trackers, *,
    evaluate: Evaluate | None,
) -> RunParts:
    """The run's parts (`parts.RunParts`), restored from the checkpoint if any; its metrics writer is open (the
    caller closes it)."""
    train = train_tasks(cfg, suite)
    allocator = build.allocator(cfg, train)
    trainer = build.trainer(cfg, policy.trainable())
    if checkpoint is not None:
        allocator.load_state_dict(checkpoint["allocator"])
        trainer.load_state_dict(checkpoint["trainer"])
        resume.set_rng_state(checkpoint["rng"])
    observers = build.observers(cfg)
    profiler = Profiler.from_config(cfg.profile, thread_cpu=cfg.profile.thread_cpu, gpu_stages=cfg.profile.gpu_stages)
    checkpointer = resume.Checkpointer(run_dir, cfg.run.checkpoint_every, job, keep_weights_every=cfg.run.keep_weights_every)
    checkpointer.latest = checkpoint
    checkpointer.written_version = checkpoint["version"] if checkpoint else None
    return RunParts(
        cfg=cfg, run_dir=run_dir, suite=suite, policy=policy, tasks={t.task_id: t for t in train}, allocator=allocator,
        trainer=trainer, profiler=profiler, metrics=MetricsWriter(run_dir, sinks=[trackers]), observers=observers,
        progress=progress, checkpointer=checkpointer, restore=checkpoint["grpo"] if checkpoint else None,
        evaluate=evaluate, heldout=splits,
    )


def _mark_peak(job: dict[str, Any], phase: str) -> None:
    """The process's peak RSS so far as `phase` ends (build, before, grpo, after; summary `peak_rss_mb_by_phase`):
    the first phase whose figure reaches the run's `peak_rss_mb` is where it peaked. A resumed process marks the
    phases it runs again."""
    job.setdefault("peak_rss_mb_by_phase", {})[phase] = round(peak_rss_mb(), 1)


def _checkpointer(parts: RunParts) -> resume.Checkpointer:
    """The job's checkpointer (a job always has one; `run_grpo` alone may run without)."""
    assert parts.checkpointer is not None, "the job builds its parts with a checkpointer"
    return parts.checkpointer


async def _finish(parts: RunParts, outcome: GrpoOutcome, measured: _Measured, stop: trio.Event) -> JobResult:
    """After the GRPO phase: the last checkpoint, the profile, held-out success after, the summary and curve."""
    cfg, run_dir, checkpointer, before = parts.cfg, parts.run_dir, _checkpointer(parts), measured.before
    version = checkpointer.write()
    checkpointer.keep_due()
    grpo_ended = time.perf_counter()
    report = parts.profiler.finish()
    parts.profiler.write(run_dir, plot=cfg.profile.plot)
    interrupted = outcome.stop_reason == "interrupted"
    overhead = parts.profiler.overhead_estimate() if parts.profiler.enabled and not interrupted else None  # ~2 s of probing
    after = {} if interrupted else await _unless_stopped(stop, run_dir, evaluate_heldout, parts.policy, parts.suite,
                                                         parts.heldout, cfg.eval.greedy, version=version)
    if not interrupted:
        write_episodes(run_dir, cfg.eval.range, before, after)
        _save_checkpoints(run_dir, _last_published(checkpointer, parts.trainer), parts.allocator)
        _mark_peak(checkpointer.job, "after")
    wall_s = checkpointer.job["job_wall_s"] + outcome.wall_s + (time.perf_counter() - grpo_ended)
    policy_stats = parts.policy.statistics()
    figures = summary(cfg, outcome, before, after, measured.warm_start_s, wall_s,
                      profiler_overhead_pct=overhead["overhead_pct"] if overhead else None,
                      generated_tokens=measured.generated_tokens,
                      machine_load=measured.machine_load) | {"decoding_workers": policy_stats.workers or 1,
                                                             "policy_statistics": policy_figures(policy_stats),
                                                             "heldout_before_reused": checkpointer.job.get("heldout_before_reused", False),
                                                             "heldout_before_version": checkpointer.job.get("heldout_before_version", 0),
                                                             "run_commits": invocations(run_dir),
                                                             "peak_rss_mb_by_phase": dict(checkpointer.job.get("peak_rss_mb_by_phase", {}))}
    if not interrupted and parts.progress is not None:
        parts.progress.message(f"held-out success after GRPO ({cfg.eval.range}):  " + fmt_eval(after)
                               + f"; paired change {fmt_change(figures['heldout_change'])}")
    if outcome.counters.evaluations:
        write_learning_curve(
            run_dir / "learning_curve.png",
            curve_points({s: r.success for s, r in before.items()}, outcome.counters.evaluations,
                         {s: r.success for s, r in after.items()}, final_wall_s=outcome.wall_s, final_env_steps=outcome.env_steps,
                         measure_range=cfg.eval.range, curve_range=cfg.eval.curve_range),
            title=f"{cfg.run.name}: held-out success (seed {cfg.run.seed})",
        )
    write_summary(run_dir, figures, {
        "Per-stage profile": report.table_markdown(),
        f"Held-out success by family ({cfg.eval.range} range)": family_table(before, after),
        "Training groups by family": group_kinds_table(outcome.counters.kinds_by_family),
        "Decoder work by fate": ledger_table(figures["ledger"]),
        "What held the event loop": blockers_table(figures["loop_blockers"], figures["loop_lag_p99_ms"]),
    } | ({"Zero-variance predictor (unbiased sample)": predictor_table(figures["gate_predictor"])}
         if figures.get("gate_predictor") else {}))
    log.info("job.finished", **{k: v for k, v in figures.items() if not isinstance(v, dict | list)})
    if interrupted:
        raise RunInterrupted(run_dir, version)
    if cfg.eval.curve_off_clock:
        await _curve_off_clock(parts, stop)
    return JobResult(run_dir, figures, outcome)


async def _curve_off_clock(parts: RunParts, stop: trio.Event) -> None:
    """`eval.curve_off_clock`: the kept versions' held-out curve (`offclock.measure_kept`), measured once the
    run's figures are written, so it is in none of them, on the run's own suite and policy (its served weights are
    no longer needed: the trained ones are in checkpoints/). Ctrl-C stops the measure, not the finished run; a
    measure that fails is `RunFailed`; either way `python run.py curve RUN_DIR` measures the versions left."""

    def say(line: str) -> None:
        log.info("curve.measured", line=line)
        if parts.progress is not None:
            parts.progress.message(f"held-out curve, off the clock: {line}")

    try:
        await _until_stopped(stop, partial(offclock.measure_kept, say=say), parts.cfg, parts.run_dir, parts.policy, parts.suite)
    except Exception as exc:
        leaf: BaseException = exc
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]  # the stop watcher's nursery wraps what the measure raised
        raise RunFailed(f"the held-out curve after the run failed: {type(leaf).__name__}: {leaf} (the run itself finished: "
                        f"summary.json is written); `python run.py curve {parts.run_dir}` measures the versions left") from exc
    if stop.is_set() and (left := offclock.unmeasured(parts.run_dir)):
        log.warning("curve.interrupted", versions_left=sorted(left))
        say(f"stopped with {len(left)} version(s) unmeasured; `python run.py curve {parts.run_dir}` measures them")


async def _build_policy(cfg: RunConfig, suite: EnvSuite, checkpoint: dict[str, Any] | None,
                        built: list[Policy]) -> tuple[Policy, float]:
    """The warm-started policy, or (resuming) the checkpoint's weights with no warm start at all; added to `built`
    (which the job closes) as soon as it exists, even if Ctrl-C comes right after."""
    t0 = time.perf_counter()
    # Ctrl-C during the build (a vLLM engine's start) stops the wait at once; the policy is closed when it exists
    if checkpoint is None:
        policy = await build_in_thread(lambda: build.policy(cfg, suite), _close)
        built.append(policy)
        trim()  # behaviour cloning's freed activations and optimizer state go back to the OS (issue 60, item 13)
        return policy, time.perf_counter() - t0
    policy = await build_in_thread(lambda: build.policy(cfg, suite, warm_start=False), _close)
    built.append(policy)
    policy.load_weights(checkpoint["version"], published_weights(checkpoint["trainer"]))
    if checkpoint["policy"] is not None:
        policy.load_sampling_state(checkpoint["policy"])
    return policy, time.perf_counter() - t0


def _close(policy: Policy) -> None:
    policy.close()


async def _measure_before(cfg: RunConfig, run_dir: Path, policy: Policy, suite: EnvSuite, splits: dict[str, list[Task]],
                          warm_started: bool) -> tuple[dict[str, EvalReport], bool]:
    """The held-out measure before GRPO, and whether it was read back (`eval.reuse_before`, a warm-started run only:
    a resumed one serves its checkpoint's weights)."""
    path = None
    if cfg.eval.reuse_before and warm_started and cfg.eval.tasks > 0:
        weights = await trio.to_thread.run_sync(lambda: before_cache.weights_digest(policy.trainable()))
        path = before_cache.path_for(cfg, before_cache.before_key(cfg, weights))
        stored = before_cache.load_before(path)
        if stored is not None:
            log.info("eval.before_reused", path=str(path))
            return reports_from_json(stored), True
    before = await evaluate_heldout(policy, suite, splits, cfg.eval.greedy)
    if path is not None:
        before_cache.store_before(path, reports_to_json(before), run_name=run_dir.name)
    return before, False


async def _unless_stopped(stop: trio.Event, run_dir: Path, fn: Any, *args: Any, version: int | None = None) -> Any:
    """`await fn(*args)`, cancelled by `stop` (then `RunInterrupted`)."""
    result = await _until_stopped(stop, fn, *args)
    if stop.is_set():
        raise RunInterrupted(run_dir, version)
    return result


async def _until_stopped(stop: trio.Event, fn: Any, *args: Any) -> Any:
    """`await fn(*args)`, cancelled by `stop` (then None)."""
    result = None
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await stop.wait()
            nursery.cancel_scope.cancel("interrupted")

        nursery.start_soon(watch)
        result = await fn(*args)
        nursery.cancel_scope.cancel()
    return result


def _last_published(checkpointer: resume.Checkpointer, trainer: Trainer) -> dict[str, Any]:
    """The weights of the run's last counted update, as its report carried the trainer's state, not the trainer's
    weights now: those are part-way through an update when the phase ended (its stop rule, its wall budget) during
    one, stopped uncounted (`Trainer.stop`). The trainer's own weights when no update was counted."""
    state = checkpointer.latest.get("trainer") if checkpointer.latest is not None else None
    return published_weights(state) if state is not None else trainer.published()


def _save_checkpoints(run_dir: Path, weights: dict[str, Any], allocator: Any) -> None:
    resume.atomic_write(run_dir / "checkpoints" / "policy.pt", lambda f: torch.save(weights, f))
    resume.atomic_write_text(run_dir / "checkpoints" / "allocator.json", json.dumps(allocator.state_dict()))
