"""The GRPO phase: every stage wired in one root nursery, run until the last learner update.

Wiring (addresses from `[transport]`; each socket has one owner task):

    admission loop --start--> rollout groups --StepStream (mem channel)--> steps sender --PUSH--> gate stage
          ^                         ^                                                              |
          |  slots freed            +---- cancel(group) <-- control receiver <--PULL-- CancelGroup-+
          |                         |
          +--- finished group --> allocator.on_result --> results sender --PUSH--> learner stage (thread)
                                    |                                                   |
                                    +--> events publisher (PUB: GroupResult, CancelGroup, WeightsPublished)
                                                                                        |
                          policy.load_weights(version) <--------------------------------+

This module is the composition root of the phase: it imports the built-in stages; the mechanism modules
of `pipeline/` do not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import trio

from gates.allocators import Allocator
from learner.stage import LearnerReport, LearnerStage
from learner.trainer import Trainer
from stages.envs.base import EnvSuite, Task
from stages.gate_stage import GateStage
from stages.policy.base import Policy
from stages.rollout import RolloutStage

from . import resume
from .allocation import AdmissionLoop, SlotPool, StalenessPacer
from .config import RunConfig
from .heldout import PeriodicHeldout
from .histogram import LogHistogram
from .messages import (
    AnyMessage,
    CancelGroup,
    ControlStream,
    GroupResult,
    PhaseFinished,
    TrajectoryStatus,
    WeightsPublished,
)
from .outcomes import FIRST_STAGE_KINDS, MergedOutcomes, is_zero_variance, label_rewards
from .profiling import Profiler
from .progress import Progress
from .rundir import MetricsWriter
from .stage import Stage, StageContext, StageFailed
from .transport import Context, open_context

log = structlog.get_logger(__name__)


@dataclass
class GrpoTally:
    """Running counts of the phase (the summary and metrics.jsonl are built from it)."""

    groups_finished: int = 0
    groups_cut: int = 0
    groups_complete: int = 0
    zero_variance_complete: int = 0
    all_fail_complete: int = 0
    all_succeed_complete: int = 0
    groups_emitted: int = 0
    cut_emission_refused: int = 0
    cancels_received: int = 0
    cancels_late: int = 0
    shadow_cancels: int = 0
    rollouts_finished: int = 0
    successes: int = 0
    window_rollouts: int = 0
    window_successes: int = 0
    window_steps_at: int = 0
    window_started: float = 0.0
    loop_lag: LogHistogram = field(default_factory=LogHistogram)
    """Loop-lag samples (seconds) in constant memory."""
    resumed_wall_s: float = 0.0
    """GRPO wall time of the run's earlier segments (before a resume)."""
    resumed_dropped_frames: dict[str, dict[str, int]] = field(default_factory=dict)
    """Frames dropped in the run's earlier segments, by socket and reason."""
    first_stage_groups: int = 0
    first_stage_cut: int = 0
    merged_full_size: int = 0
    """Prompts whose merged group (all its rollout groups) has >= G complete trajectories."""
    merged_zero_variance: int = 0
    staleness_lag_max: float = 0.0
    items_dropped_stale: int = 0
    items_trained: int = 0
    lag_sum: float = 0.0
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    eval_s: float = 0.0


@dataclass
class GrpoOutcome:
    stop_reason: str
    wall_s: float
    updates: int
    tally: GrpoTally
    admission: AdmissionLoop
    rollout: RolloutStage
    learner: LearnerStage
    gate: GateStage | None
    allocator: Allocator
    slot_occupancy: float
    trajectory_slot_occupancy: float
    dropped_frames: dict[str, dict[str, int]] = field(default_factory=dict)
    """Frames dropped by each receiving socket, by reason (bad frames, forged or inconsistent messages)."""

    @property
    def env_steps(self) -> int:
        return self.rollout.env_steps

    def loop_lag_p99_ms(self) -> float:
        return _p99_ms(self.tally.loop_lag)


async def _publish_events(
    zmq: Context, address: str, hwm: int, inbox: trio.MemoryReceiveChannel[AnyMessage], *, task_status: Any
) -> None:
    pub = zmq.socket("pub", address, bind=True, hwm=hwm)
    async with pub, inbox:
        task_status.started()
        async for message in inbox:
            await pub.send(message)


async def _run_observers(observers: Sequence[Stage], ctx: StageContext, finished: trio.Event, *, task_status: Any) -> None:
    """Run the custom stages; a stage that raises stops the run with one message naming it."""
    async with trio.open_nursery() as nursery:
        for observer in observers:
            await nursery.start(_run_observer, observer, ctx)
        task_status.started()
    finished.set()


async def _run_observer(observer: Stage, ctx: StageContext, *, task_status: Any) -> None:
    name = getattr(observer, "name", type(observer).__name__)
    try:
        await observer.run(ctx, task_status=task_status)
    except Exception as exc:  # a plugin's bug: one clear line, not an exception-group traceback
        raise StageFailed(name, f"{type(exc).__name__}: {exc}") from exc


async def _send_all(zmq: Context, address: str | None, hwm: int, inbox: trio.MemoryReceiveChannel[Any], *, task_status: Any) -> None:
    """Own one PUSH socket and forward everything from a memory channel (None address: discard)."""
    if address is None:
        task_status.started()
        async with inbox:
            async for _ in inbox:
                pass
        return
    push = zmq.socket("push", address, bind=False, hwm=hwm)
    async with push, inbox:
        task_status.started()
        async for message in inbox:
            await push.send(message)


async def _monitor_loop_lag(tally: GrpoTally, period_s: float = 0.01) -> None:
    """Overshoot of a 10 ms sleep: how long the Trio loop was kept from running ready tasks."""
    while True:
        before = trio.current_time()
        await trio.sleep(period_s)
        tally.loop_lag.add(max(0.0, trio.current_time() - before - period_s))


async def _host_nursery(*, task_status: Any) -> None:
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep_forever()


async def run_grpo(
    cfg: RunConfig,
    *,
    suite: EnvSuite,
    policy: Policy,
    tasks: Mapping[str, Task],
    allocator: Allocator,
    trainer: Trainer,
    run_dir: Path,
    profiler: Profiler,
    metrics: MetricsWriter,
    observers: Sequence[Stage] = (),
    progress: Progress | None = None,
    checkpointer: resume.Checkpointer | None = None,
    restore: Mapping[str, Any] | None = None,
    stop: trio.Event | None = None,
    evaluate: Callable[[int, Mapping[str, Any]], Awaitable[dict[str, float]]] | None = None,
) -> GrpoOutcome:
    """Train until `run.updates` learner updates (or `run.max_wall_s`, or `stop`); returns the phase's outcome.

    `checkpointer` captures the state at every update boundary; `restore` (a checkpoint's `grpo` counters)
    continues a stopped run's counts; `stop` (Ctrl-C) ends the phase at once: an update under way is not
    counted, the checkpoint is the last update boundary. `evaluate(version, weights)` measures held-out
    success every `eval.every` updates (and `run.target_heldout` may end the phase).
    """
    tally = GrpoTally()
    done = trio.Event()
    stop_reason = "updates"
    t = cfg.transport
    slots = SlotPool(cfg.rollout.slots)
    pacer = StalenessPacer(cfg.learner.batch_groups, cfg.learner.max_staleness)
    gate_stage = (
        GateStage(
            gate=cfg.gate.name, k=cfg.gate.k, tau=cfg.gate.tau, checkpoints=cfg.gate.checkpoints,
            shadow=cfg.gate.shadow, options=cfg.gate.options,
        )
        if cfg.gate.enabled
        else None
    )
    events_send, events_recv = trio.open_memory_channel[AnyMessage](1024)
    steps_send, steps_recv = trio.open_memory_channel[Any](4096)
    results_send, results_recv = trio.open_memory_channel[GroupResult](4 * cfg.learner.batch_groups)
    rollout = RolloutStage(
        suite, policy, tasks, steps_send, profiler=profiler, step_timeout_s=cfg.rollout.step_timeout_s,
        max_error_rate=cfg.rollout.max_error_rate, min_trajectories=cfg.rollout.min_trajectories_for_error_rate,
        on_trajectory_end=lambda: admission.trajectory_finished(),
    )
    merged = MergedOutcomes(on_settled=lambda rewards, _: _tally_prompt(tally, rewards, cfg.rollout.group_size), window=64)
    heldout = PeriodicHeldout(evaluate, cfg.eval.every, cfg.run.updates, metrics, progress,
                              on_row=lambda row, spent: _tally_heldout(tally, row, spent), target=cfg.run.target_heldout)

    def publish(version: int, state: Mapping[str, Any]) -> None:
        policy.load_weights(version, state)
        heldout.published(version, state)

    attach = getattr(policy, "attach_profiler", None)  # optional: a backend that records its own spans
    if attach is not None:
        attach(profiler)
    started = trio.current_time()
    tally.window_started = started

    async def on_update(report: LearnerReport) -> None:
        allocator.on_update(report.version)
        admission.wake()
        await events_send.send(
            WeightsPublished(version=report.version, groups_trained=learner.counters.groups_trained, published_at=trio.current_time())
        )
        row = _metrics_row(report, tally, rollout, learner, allocator, gate_stage, slots, started)
        metrics.write(row)
        if checkpointer is not None:
            state = _checkpoint_state(report.version, trainer, policy, allocator, admission, tally, rollout, learner, gate_stage, started)
            state["grpo"]["dropped_frames"] = resume.add_counts(tally.resumed_dropped_frames, zmq.dropped_frames())
            checkpointer.capture(state)
            await checkpointer.after_update(report.version)
        if progress is not None:
            progress.update_line(row, final=True)
        heldout.start_if_due(report.version, evals, wall_s=lambda: trio.current_time() - started,
                             env_steps=lambda: rollout.env_steps)
        if report.version >= cfg.run.updates:
            done.set()

    def on_consumed(n: int) -> None:
        pacer.consumed(n)
        admission.wake()

    learner = LearnerStage(trainer, cfg.learner, publish=publish, on_consumed=on_consumed, on_update=on_update)

    async def run_one(group_id: int, admission_: Any) -> None:
        kind = getattr(admission_, "kind", "group")
        parent = getattr(admission_, "parent", None)
        if kind in FIRST_STAGE_KINDS:
            merged.open_root(group_id, kind)
        else:
            merged.open_child(group_id, parent)
        result = await rollout.run_group(group_id, admission_.task_id, admission_.size, kind=kind, parent=parent)
        admission.group_finished(cut_slots=sum(t.status == TrajectoryStatus.CUT for t in result.trajectories) if result.cut else 0)
        _tally_group(tally, result)
        if result.cut:
            merged.discard(group_id)
        else:
            merged.add(group_id, label_rewards(result))
        training = allocator.on_result(result)
        refused = [g for g in training if g.cut]
        if refused:  # an allocator bug must not leak a cut group into training
            tally.cut_emission_refused += len(refused)
            log.error("grpo.allocator_emitted_cut_group", group_ids=[g.group_id for g in refused])
            training = [g for g in training if not g.cut]
        pacer.finished(len(training))
        tally.groups_emitted += len(training)
        await events_send.send(result)
        for group in training:
            learner.expect(group.group_id)
            await results_send.send(group)
        admission.wake()

    async def receive_control(zmq: Context, *, task_status: Any) -> None:
        control = zmq.socket("pull", t.control, bind=True, receives=ControlStream, hwm=t.hwm, name="control")
        async with control:
            task_status.started()
            async for decision in control:
                reason = _control_problem(decision, gate_stage, admission.next_group_id)
                if reason is not None:
                    control.drop(reason, f"cancel of group {decision.group_id} by {decision.gate!r}")
                    continue
                await _apply_cut(decision, rollout, tally)
                await events_send.send(decision)

    async with open_context(t.curve_dir) as zmq:  # CURVE on tcp sockets when keys are configured
        stage_ctx = StageContext(zmq=zmq, addresses=t, run_dir=run_dir, profiler=profiler)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_monitor_loop_lag, tally)
            await nursery.start(_publish_events, zmq, t.events, t.hwm, events_recv)
            observers_done = trio.Event()
            await nursery.start(_run_observers, observers, stage_ctx, observers_done)
            evals = await nursery.start(_host_nursery)
            nursery.start_soon(_set_on, heldout.target_reached, done)
            async with trio.open_nursery() as work:  # everything that trains: cancelled at the last update
                await work.start(policy.serve)
                await work.start(learner.run, stage_ctx)
                await work.start(receive_control, zmq)
                if gate_stage is not None:
                    await work.start(gate_stage.run, stage_ctx)
                await work.start(_send_all, zmq, t.steps if gate_stage else None, t.hwm, steps_recv)
                await work.start(_send_all, zmq, t.results, t.hwm, results_recv)
                groups = await work.start(_host_nursery)
                admission = AdmissionLoop(allocator, slots, pacer, lambda gid, adm: groups.start_soon(run_one, gid, adm))
                if restore is not None:
                    resume.restore_counters(restore, tally=tally, admission=admission, rollout=rollout, learner=learner, gate=gate_stage)
                if learner.version >= cfg.run.updates:
                    done.set()  # resumed after the last update: nothing left to train
                if stop is not None:
                    work.start_soon(_set_on, stop, done)
                await work.start(admission.run)
                if progress is not None:
                    work.start_soon(progress.tick, lambda: _live_status(tally, rollout, learner, slots, pacer, started))
                with trio.move_on_after(cfg.run.max_wall_s) as deadline:
                    await done.wait()
                if stop is not None and stop.is_set() and learner.version < cfg.run.updates:
                    stop_reason = "interrupted"
                elif heldout.target_reached.is_set() and learner.version < cfg.run.updates:
                    stop_reason = "target_heldout"
                elif deadline.cancelled_caught:
                    stop_reason = "max_wall_s"
                    log.warning("grpo.wall_limit", max_wall_s=cfg.run.max_wall_s, updates=learner.version)
                occupancy = slots.occupancy()
                ended = trio.current_time()
                wall = ended - started + tally.resumed_wall_s
                trajectory_occupancy = rollout.trajectory_seconds / (cfg.rollout.slots * wall) if wall > 0 else float("nan")
                work.cancel_scope.cancel("GRPO phase finished")  # no update or rollout after the last one
            if stop_reason == "updates" or stop_reason == "target_heldout":
                await heldout.idle()  # a held-out measure in flight belongs to the curve
            await events_send.send(PhaseFinished(updates=learner.version, stop_reason=stop_reason))
            if stop_reason != "interrupted":  # Ctrl-C must stay fast: no waiting on plugins
                with trio.move_on_after(cfg.transport.drain_s):  # stages that return on PhaseFinished saw everything
                    await observers_done.wait()
            nursery.cancel_scope.cancel("GRPO phase finished")
    merged.flush()
    if gate_stage is not None:
        gate_stage.finish()
    dropped = resume.add_counts(tally.resumed_dropped_frames, zmq.dropped_frames())
    return GrpoOutcome(
        stop_reason=stop_reason,
        wall_s=ended - started + tally.resumed_wall_s,
        updates=learner.version,
        tally=tally,
        admission=admission,
        rollout=rollout,
        learner=learner,
        gate=gate_stage,
        allocator=allocator,
        slot_occupancy=occupancy,
        trajectory_slot_occupancy=trajectory_occupancy,
        dropped_frames=dropped,
    )


def _control_problem(decision: CancelGroup, gate: GateStage | None, next_group_id: int) -> str | None:
    """Why a cut decision cannot be from this run's gate stage (None: apply it)."""
    if gate is None:
        return "no_gate"
    if decision.gate != gate.gate.name:
        return "unknown_gate"
    if decision.shadow != gate.shadow:
        return "shadow_mismatch"
    if not 0 <= decision.group_id < next_group_id:
        return "unknown_group"
    return None


async def _apply_cut(decision: CancelGroup, rollout: RolloutStage, tally: GrpoTally) -> None:
    tally.cancels_received += 1
    if decision.shadow:
        tally.shadow_cancels += 1
        return
    if not rollout.cancel(decision.group_id, decision.reason, decision.value):
        tally.cancels_late += 1  # the group had already returned (a finished group's late cut is counted by the rollout)
    await trio.lowlevel.checkpoint()


def _tally_heldout(tally: GrpoTally, row: dict[str, Any], seconds: float) -> None:
    tally.evaluations.append(row)
    tally.eval_s += seconds


def _tally_prompt(tally: GrpoTally, rewards: list[float], group_size: int) -> None:
    """A prompt's merged group settled: count it if it has a full group of complete trajectories."""
    if len(rewards) >= group_size:
        tally.merged_full_size += 1
        tally.merged_zero_variance += is_zero_variance(rewards)


def _tally_group(tally: GrpoTally, result: GroupResult) -> None:
    tally.groups_finished += 1
    if result.kind in FIRST_STAGE_KINDS:
        tally.first_stage_groups += 1
        tally.first_stage_cut += result.cut
    rewards = label_rewards(result)
    if result.cut:
        tally.groups_cut += 1
        return
    tally.groups_complete += 1
    tally.zero_variance_complete += is_zero_variance(rewards)
    wins = sum(tr.success for tr in result.trajectories)
    tally.all_fail_complete += wins == 0
    tally.all_succeed_complete += wins == len(rewards)
    tally.rollouts_finished += len(rewards)
    tally.successes += wins
    tally.window_rollouts += len(rewards)
    tally.window_successes += wins


def _metrics_row(
    report: LearnerReport,
    tally: GrpoTally,
    rollout: RolloutStage,
    learner: LearnerStage,
    allocator: Allocator,
    gate: GateStage | None,
    slots: SlotPool,
    started: float,
) -> dict[str, Any]:
    now = trio.current_time()
    window_s = max(now - tally.window_started, 1e-9)
    steps = rollout.env_steps - tally.window_steps_at
    row: dict[str, Any] = {
        "iteration": report.version,
        "wall_s": now - started + tally.resumed_wall_s,
        "success_rate": tally.window_successes / tally.window_rollouts if tally.window_rollouts else None,
        "groups_admitted": tally.groups_finished + rollout.running_groups,
        "groups_cut": tally.groups_cut,
        "groups_trained": learner.counters.groups_trained,
        "groups_dropped_zero_variance": learner.counters.groups_dropped_zero_variance,
        "zero_variance_fraction": tally.merged_zero_variance / tally.merged_full_size if tally.merged_full_size else None,
        "slot_occupancy": slots.occupancy(),
        "env_steps": rollout.env_steps,
        "env_steps_per_s": steps / window_s,
        "train_s": report.train_seconds,
        "loop_lag_p99_ms": _p99_ms(tally.loop_lag),
    }
    row |= dict(report.stats)
    tally.staleness_lag_max = max(tally.staleness_lag_max, report.stats.get("staleness_lag_max", 0.0))
    items = report.stats.get("learner/items", 0.0)
    tally.items_trained += int(items)
    tally.lag_sum += report.stats.get("staleness_lag_mean", 0.0) * items
    tally.items_dropped_stale += int(report.stats.get("learner/items_dropped_stale", 0.0))
    row["trajectory_slot_occupancy"] = rollout.trajectory_seconds / (slots.total * (now - started)) if now > started else None
    row |= dict(allocator.statistics())
    if gate is not None:
        row |= gate.statistics()
    tally.window_rollouts = tally.window_successes = 0
    tally.window_steps_at = rollout.env_steps
    tally.window_started = now
    return row


def _p99_ms(samples: LogHistogram) -> float:
    return samples.quantile(0.99) * 1e3


async def _set_on(stop: trio.Event, done: trio.Event) -> None:
    await stop.wait()
    done.set()


def _checkpoint_state(
    version: int, trainer: Trainer, policy: Policy, allocator: Allocator, admission: AdmissionLoop, tally: GrpoTally,
    rollout: RolloutStage, learner: LearnerStage, gate: GateStage | None, started: float,
) -> dict[str, Any]:
    """Everything `pipeline.resume` saves, taken between updates (the learner thread is idle)."""
    sampling_state = getattr(policy, "sampling_state", None)  # optional on a backend
    return {
        "version": version,
        "trainer": trainer.state_dict(),
        "policy": sampling_state() if sampling_state is not None else None,
        "allocator": allocator.state_dict(),
        "grpo": resume.capture_counters(
            tally=tally, admission=admission, rollout=rollout, learner=learner, gate=gate,
            wall_s=trio.current_time() - started + tally.resumed_wall_s,
        ),
        "rng": resume.rng_state(),
    }


def _live_status(tally: GrpoTally, rollout: RolloutStage, learner: LearnerStage, slots: SlotPool, pacer: StalenessPacer, started: float) -> dict[str, Any]:
    elapsed = max(trio.current_time() - started, 1e-9)
    return {
        "iteration": learner.version,
        "groups_admitted": tally.groups_finished + rollout.running_groups,
        "groups_cut": tally.groups_cut,
        "groups_trained": learner.counters.groups_trained,
        "slot_occupancy": slots.busy / slots.total,
        "env_steps_per_s": rollout.env_steps / elapsed,
        "success_rate": tally.successes / tally.rollouts_finished if tally.rollouts_finished else None,
        "outstanding": pacer.outstanding,
    }
