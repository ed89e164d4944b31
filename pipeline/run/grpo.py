"""The GRPO phase: every stage wired in one root nursery, run until the last learner update.

Wiring (addresses from `[transport]`; each socket has one owner, named first):

    group lifecycle --run_group--> rollout stage --steps PUSH--> gate stage (steps PULL)
      (admission)                    (control PULL) <--CancelGroup-- gate stage (control PUSH)
          |  finished group -> allocator -> training groups
          +--> results PUSH --> learner stage (results PULL; a worker thread, or its own process)
          +--> events channel --> events PUB (GroupResult, CancelGroup, WeightsPublished, PhaseFinished)
    learner stage --LearnerReport / GroupsConsumed--> update recorder (one task): policy.load_weights,
          lifecycle (staleness budget, allocator.on_update), metrics row, checkpoint, progress, held-out

The gate and learner come as handles (`placement.py`): the same code runs whether they are in this process
or in children of their own (`transport.mode = "processes"`; Ray actors with `placement.launcher = "ray"`).
Start order: what this process binds (events, reports, control), then the learner and the gate, each
started with the address its socket bound (a Ray actor's ephemeral port), then what connects to them (the
steps and results PUSH), then admission.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog
import trio

from gates.allocators import Allocator
from gates.zero_variance import AdmissionScreen, ZeroVarianceGate
from pipeline.allocation import SlotPool, StalenessPacer
from pipeline.counters import PhaseCounters
from pipeline.lifecycle import GroupLifecycle
from pipeline.messages import AnyMessage, GroupDropped, GroupResult, PhaseFinished
from pipeline.sealing import new_secret
from pipeline.stage import StageContext
from pipeline.transport import open_context
from stages.envs.base import Task
from stages.gate_stage import GateStage
from stages.policy.base import Policy
from stages.rollout import RolloutStage

from . import resume
from .heldout import PeriodicHeldout
from .loop_watch import LOOP_STAGE, LoopWatch, watching
from .parts import RunParts
from .placement import GateHandle, PhaseStages, addresses, place_stages
from .runtime import (
    host_nursery,
    monitor_loop_lag,
    publish_events,
    run_observers,
    send_all,
    set_on,
)
from .updates import Phase, UpdateRecorder, live_status

log = structlog.get_logger(__name__)


@dataclass
class GrpoOutcome:
    stop_reason: str
    wall_s: float
    rollout_wall_s: float
    """`wall_s` less the phase's start (decoders, stages) before admission began (`Phase.rollout_wall_s`)."""
    updates: int
    counters: PhaseCounters
    lifecycle: GroupLifecycle
    rollout: RolloutStage
    gate: GateHandle | None
    """None without a gate."""
    allocator: Allocator
    slot_occupancy: float
    trajectory_slot_occupancy: float
    dropped_frames: dict[str, dict[str, int]] = field(default_factory=dict)
    """Frames dropped by each receiving socket, by reason (bad frames, forged or inconsistent messages)."""
    pacer_held_slot_s: float = 0.0
    busy_slot_s: float = 0.0
    """This segment's slot-seconds held free by the staleness pacer, and busy, at the phase's end (the ledger's idle
    fractions)."""

    @property
    def env_steps(self) -> int:
        return self.rollout.env_steps

    def loop_lag_p99_ms(self) -> float:
        return self.counters.loop_lag_p99_ms()


@dataclass
class _Wiring:
    """The phase's parts before they run (`_build`)."""

    phase: Phase
    rollout: RolloutStage
    stages: PhaseStages
    heldout: PeriodicHeldout
    recorder: UpdateRecorder
    events: trio.MemorySendChannel[AnyMessage]
    events_in: trio.MemoryReceiveChannel[AnyMessage]
    training: trio.MemoryReceiveChannel[GroupResult]


async def run_grpo(parts: RunParts, *, stop: trio.Event | None = None) -> GrpoOutcome:
    """Train until `run.updates` learner updates (or `run.max_wall_s`, or `stop`); returns the phase's outcome.

    `parts.checkpointer` captures the state at every update boundary; `parts.restore` (a checkpoint's `grpo`
    counters) continues a stopped run's counts; `stop` (Ctrl-C) ends the phase at once: an update under way is
    not counted, the checkpoint is the last update boundary. `parts.evaluate(version, weights)` measures
    held-out success every `eval.every` updates (and `run.target_heldout` may end the phase).
    """
    cfg, policy, progress = parts.cfg, parts.policy, parts.progress
    secret = new_secret()  # seals every frame of the phase's sockets; stage processes get it as they start
    stages = place_stages(cfg, parts.trainer, capture_state=parts.checkpointer is not None, secret=secret)
    async with stages.placed() as where, open_context(cfg.transport.curve_dir, **where.context_options) as zmq, \
            addresses(cfg) as configured:

        def dropped_frames() -> dict[str, dict[str, int]]:
            """The phase's sockets' drops and refusals, and the policy's own (the decoding workers' pool)."""
            return resume.add_counts(zmq.dropped_frames(), policy.dropped_frames())

        t = where.bind(configured)
        w = _build(parts, stages, dropped_frames)
        phase, ctx = w.phase, StageContext(zmq=zmq, addresses=t, run_dir=parts.run_dir, profiler=parts.profiler)

        def reached(**bound: str) -> StageContext:
            """`ctx` with the addresses this process bound, as its peers reach them."""
            return _with_addresses(ctx, **{k: where.reachable(v) for k, v in bound.items()})

        watch = LoopWatch(phase.counters.loop_blocks, clock=parts.profiler.clock,
                          record=lambda name, t0, t1: parts.profiler.record(LOOP_STAGE, name, t0, t1))
        with watching(watch):  # whose time a late tick was
            async with trio.open_nursery() as nursery:
                nursery.start_soon(monitor_loop_lag, phase.counters)
                ctx = reached(events=await nursery.start(publish_events, zmq, t.events, t.hwm, w.events_in))
                observers_done = trio.Event()
                await nursery.start(run_observers, parts.observers, ctx, observers_done)
                evals = await nursery.start(host_nursery)
                nursery.start_soon(set_on, w.heldout.target_reached, phase.done)
                async with trio.open_nursery() as work:  # everything that trains: cancelled at the last update
                    await work.start(policy.serve)
                    await _start_stages(work, w, zmq, ctx, reached, nursery)
                    await work.start(w.recorder.consume, w.stages.reports, evals)
                    await work.start(phase.lifecycle.run, w.rollout)
                    phase.admission_began()
                    if stop is not None:
                        work.start_soon(set_on, stop, phase.done)
                    if progress is not None:
                        work.start_soon(progress.tick, lambda: live_status(phase))
                    outcome = await _until_done(w, stop)
                    work.cancel_scope.cancel("GRPO phase finished")  # no update or rollout after the last one
                await _finish(w, outcome.stop_reason, observers_done)
                nursery.cancel_scope.cancel("GRPO phase finished")
    phase.lifecycle.finish(w.rollout.abandoned)
    if w.stages.gate is not None:
        w.stages.gate.finish()
    outcome.dropped_frames = resume.add_counts(phase.counters.resumed_dropped_frames, dropped_frames())
    return outcome


def _build(parts: RunParts, stages: PhaseStages, dropped_frames: Any) -> _Wiring:
    cfg, policy, tasks, allocator, profiler = parts.cfg, parts.policy, parts.tasks, parts.allocator, parts.profiler
    metrics, progress, restore = parts.metrics, parts.progress, parts.restore
    counters, slots = PhaseCounters(family_of={t.task_id: t.family for t in tasks.values()}), SlotPool(cfg.rollout.slots)
    pacer = StalenessPacer(cfg.learner.batch_groups, cfg.learner.max_staleness)
    events, events_in = trio.open_memory_channel[AnyMessage](1024)
    training_out, training = trio.open_memory_channel[GroupResult](4 * cfg.learner.batch_groups)
    lifecycle = GroupLifecycle(allocator, slots, pacer, counters, group_size=cfg.rollout.group_size,
                               training=stages.learner.training_sink(training_out), events=events.clone())
    screen_admissions(lifecycle, stages.gate, tasks, policy)
    rollout = RolloutStage(
        parts.suite, policy, tasks, cfg.rollout, profiler=profiler, on_trajectory_end=lifecycle.trajectory_finished,
        events=events.clone(),
    )
    phase = Phase(cfg, counters, slots, pacer, lifecycle, rollout, allocator, policy, stages.gate, dropped_frames,
                  tokens_at_start=policy.statistics().generated_tokens)
    if restore is not None:
        phase.version = stages.learner.version = resume.restore_counters(
            restore, counters=counters, admission=lifecycle.admission, rollout=rollout, gate=stages.gate)
    if phase.version >= cfg.run.updates:
        phase.done.set()  # resumed after the last update: nothing left to train
    heldout = PeriodicHeldout(parts.evaluate, cfg.eval.every, cfg.run.updates, metrics, progress,
                              on_row=counters.heldout_measured, target=cfg.run.target_heldout,
                              range_name=cfg.eval.curve_range)
    recorder = UpdateRecorder(phase, events=events.clone(), metrics=metrics, heldout=heldout, profiler=profiler,
                              checkpointer=parts.checkpointer, progress=progress)
    policy.attach_profiler(profiler)  # a no-op unless the backend records its own spans (`Policy.attach_profiler`)
    phase.started = counters.window_started = trio.current_time()
    return _Wiring(phase, rollout, stages, heldout, recorder, events, events_in, training)


def screen_admissions(lifecycle: GroupLifecycle, gate: GateHandle | None, tasks: Mapping[str, Task], policy: Policy) -> bool:
    """Let the zero-variance gate skip prompts at admission (k = 0) where it runs in this process and cuts
    (not in shadow mode) and the allocator can skip; True when wired. In processes mode the gate's model
    lives in its child: prompts are not screened (its in-flight checkpoints still run)."""
    if not (isinstance(gate, GateStage) and isinstance(gate.gate, ZeroVarianceGate)):
        return False
    if gate.shadow or not gate.gate.options.admission:
        return False
    return lifecycle.admission.use_screen(AdmissionScreen(gate.gate, tasks, lambda: policy.version))


async def _start_stages(work: trio.Nursery, w: _Wiring, zmq: Any, ctx: StageContext, reached: Any, observing: trio.Nursery) -> None:
    """What this process binds first (the stage children connect to it), then the stages, each started with
    the address it bound (a Ray actor's ephemeral port), then what connects to them. Custom stages in children
    of their own start in `observing`, which outlives the training: they read the events to `PhaseFinished`."""
    reports = await work.start(w.stages.receive_reports, ctx)  # stage children's reports, read to the gate's last
    ctx = reached(reports=reports, control=await work.start(w.rollout.run, ctx))
    for custom in w.stages.custom:
        await observing.start(custom.run, ctx)
    results = await work.start(w.stages.learner.run, ctx)
    steps = ctx.addresses.steps
    if w.stages.gate is not None:
        steps = await work.start(w.stages.gate.run, ctx)
        w.rollout.gate = w.stages.gate.identity()
    ctx = _with_addresses(ctx, results=results, steps=steps)
    await work.start(w.rollout.send_steps, ctx)
    await work.start(send_all, zmq, results, ctx.addresses.hwm, w.training)


def _with_addresses(ctx: StageContext, **addresses: str) -> StageContext:
    return dataclasses.replace(ctx, addresses=msgspec.structs.replace(ctx.addresses, **addresses))


async def _until_done(w: _Wiring, stop: trio.Event | None) -> GrpoOutcome:
    """Wait for the last update (or the wall limit, Ctrl-C, the held-out target); the outcome so far."""
    phase, cfg = w.phase, w.phase.cfg
    with trio.move_on_after(cfg.run.max_wall_s) as deadline:
        await phase.done.wait()
    stop_reason = "updates"
    if stop is not None and stop.is_set() and phase.version < cfg.run.updates:
        stop_reason = "interrupted"
    elif w.heldout.target_reached.is_set() and phase.version < cfg.run.updates:
        stop_reason = "target_heldout"
    elif deadline.cancelled_caught:
        stop_reason = "max_wall_s"
        log.warning("grpo.wall_limit", max_wall_s=cfg.run.max_wall_s, updates=phase.version)
    wall, window = phase.wall_s(), phase.rollout_wall_s()
    return GrpoOutcome(
        stop_reason=stop_reason, wall_s=wall, rollout_wall_s=window, updates=phase.version, counters=phase.counters,
        lifecycle=phase.lifecycle, rollout=w.rollout, gate=phase.gate, allocator=phase.allocator, slot_occupancy=phase.slots.occupancy(),
        trajectory_slot_occupancy=w.rollout.running_seconds() / (cfg.rollout.slots * window) if window > 0 else float("nan"),
        pacer_held_slot_s=phase.lifecycle.admission.held_slot_seconds(), busy_slot_s=phase.slots.busy_seconds(),
    )


async def _finish(w: _Wiring, stop_reason: str, observers_done: trio.Event) -> None:
    """After the last update: let a held-out measure in flight end, then the custom stages read to the end."""
    if stop_reason in ("updates", "target_heldout"):
        await w.heldout.idle()  # a held-out measure in flight belongs to the curve
    left = w.phase.lifecycle.at_learner  # the learner's reports are no longer read: these will never train
    w.phase.counters.groups_dropped_run_ended = len(left)
    for group_id in left:
        await w.events.send(GroupDropped(group_id=group_id, reason="run_ended"))
    await w.events.send(PhaseFinished(updates=w.phase.version, stop_reason=stop_reason))
    if stop_reason != "interrupted":  # Ctrl-C must stay fast: no waiting on plugins
        with trio.move_on_after(w.phase.cfg.transport.drain_s):  # stages that return on PhaseFinished saw everything
            await observers_done.wait()
            for custom in w.stages.custom:  # and those in processes of their own, once they returned
                await custom.finished.wait()
