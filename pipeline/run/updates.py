"""What the runtime does with the learner stage's reports: one task consumes them, in order.

For each `LearnerReport`: load the new weights into the policy (and keep them if a held-out measure is
due), count the update, give the staleness budget back and tell the allocator (the group lifecycle), send
`WeightsPublished` to the event stream, write the metrics row, capture a checkpoint at this update boundary
(the report carries the trainer's state), refresh the progress line, start a due held-out measure, and end
the phase after the last update. For each `GroupsConsumed`: count it and give its budget back, and say so
when the learner is starved (`Starvation`). The learner stage only sends; nothing here calls into it, so it
may run in another process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
import trio

from pipeline.allocation import SlotPool, StalenessPacer
from pipeline.config import RunConfig
from pipeline.counters import GroupsConsumed, LearnerReport, PhaseCounters
from pipeline.lifecycle import GroupLifecycle
from pipeline.messages import AnyMessage, GroupDropped, WeightsPublished
from pipeline.profiling import Profiler
from pipeline.progress import Progress
from pipeline.rundir import MetricsWriter

from . import resume
from .heldout import PeriodicHeldout
from .placement import GateHandle

if TYPE_CHECKING:
    from stages.policy.base import Policy

log = structlog.get_logger(__name__)

STARVED_BATCHES = 8
"""Zero-variance groups the learner may drop since its last update, in learner batches, before the run says it
is starved (at 8: more than 8 of every 9 groups that reached it carried no gradient)."""


@dataclass
class Phase:
    """The running phase's parts, as the runtime's tasks read them."""

    cfg: RunConfig
    counters: PhaseCounters
    slots: SlotPool
    pacer: StalenessPacer
    lifecycle: GroupLifecycle
    rollout: Any
    """The rollout stage (env_steps, running_seconds(), its resume counters)."""
    allocator: Any
    policy: Policy
    gate: GateHandle | None
    dropped_frames: Callable[[], dict[str, dict[str, int]]]
    version: int = 0
    started: float = 0.0
    done: trio.Event = field(default_factory=trio.Event)
    tokens_at_start: int = 0
    """The policy's generated tokens when the phase began."""

    def wall_s(self) -> float:
        return trio.current_time() - self.started + self.counters.resumed_wall_s

    def rollout_wall_s(self) -> float:
        """The GRPO wall since admission began (resumes included): what rates and occupancy are taken over, so
        that starting the decoders (seconds for 8 processes importing torch) is not read as idle slots."""
        return self.wall_s() - self.counters.start_s

    def admission_began(self) -> None:
        self.counters.start_s += trio.current_time() - self.started

    def generated_tokens(self) -> int:
        """Tokens the policy generated in this phase so far (since a resume: in this process)."""
        return self.policy.statistics().generated_tokens - self.tokens_at_start


@dataclass
class Starvation:
    """Zero-variance groups the learner dropped since its last update. A streaming run whose every group has zero
    reward variance (a warm start that wins none of its tasks, or all of them) never fills a batch, and would run
    to `run.max_wall_s` saying nothing; this says so at `STARVED_BATCHES` batches' worth, then at each doubling."""

    batch_groups: int
    dropped: int = 0
    warn_at: int = field(init=False)

    def __post_init__(self) -> None:
        self.updated()

    def group_dropped(self) -> bool:
        """Count one dropped group; True when the run should say it is starved."""
        self.dropped += 1
        if self.dropped < self.warn_at:
            return False
        self.warn_at *= 2
        return True

    def updated(self) -> None:
        """The learner trained: count from zero again."""
        self.dropped, self.warn_at = 0, STARVED_BATCHES * self.batch_groups


def starved_note(*, complete: int, all_fail: int, all_succeed: int) -> str:
    """Why a learner is starved, from the phase's complete groups (all failed, or all won), and what would give it
    mixed groups."""
    if complete and all_fail >= 0.9 * complete:
        why = (f"{all_fail} of {complete} complete groups failed in every rollout: the policy wins almost none of these "
               "tasks (a stronger warm start, an easier task range or a larger rollout.group_size gives it mixed groups)")
    elif complete and all_succeed >= 0.9 * complete:
        why = (f"{all_succeed} of {complete} complete groups won in every rollout: these tasks are too easy for the "
               "policy (a harder task range gives it mixed groups)")
    else:
        why = f"{all_fail} of {complete} complete groups failed in every rollout, {all_succeed} won in every one"
    return why + "; the run goes on to run.updates or run.max_wall_s"


class UpdateRecorder:
    def __init__(self, phase: Phase, *, events: trio.MemorySendChannel[AnyMessage], metrics: MetricsWriter,
                 heldout: PeriodicHeldout, profiler: Profiler, checkpointer: resume.Checkpointer | None,
                 progress: Progress | None) -> None:
        self.phase, self.events, self.metrics, self.heldout = phase, events, metrics, heldout
        self.profiler, self.checkpointer, self.progress = profiler, checkpointer, progress
        self.starvation = Starvation(phase.cfg.learner.batch_groups)

    async def consume(self, reports: Any, evals: trio.Nursery, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Consume the learner's reports (a channel or a socket) until cancelled."""
        phase = self.phase
        async with reports:
            task_status.started()
            async for message in reports:
                if phase.done.is_set():
                    continue  # the phase ended: an update the learner finished after the last one is not counted
                if isinstance(message, GroupsConsumed):
                    phase.counters.learner_dropped(message)
                    phase.lifecycle.learner_dropped(message.group_id)
                    await self.events.send(GroupDropped(group_id=message.group_id, reason=message.reason))
                    if message.zero_variance and self.starvation.group_dropped():
                        self.starved()
                else:
                    await self.updated(message, evals)

    def starved(self) -> None:
        phase, counters = self.phase, self.phase.counters
        log.warning("learner.starved", dropped_zero_variance=self.starvation.dropped, since_update=phase.version,
                    batch_groups=phase.cfg.learner.batch_groups, max_wall_s=phase.cfg.run.max_wall_s,
                    note=starved_note(complete=counters.groups_complete, all_fail=counters.all_fail_complete,
                                      all_succeed=counters.all_succeed_complete))

    async def updated(self, report: LearnerReport, evals: trio.Nursery) -> None:
        phase = self.phase
        self.starvation.updated()
        with self.profiler.span("learner", "weight_publish"):
            phase.policy.load_weights(report.version, report.weights)
        self.heldout.published(report.version, report.weights, wall_s=phase.wall_s(), env_steps=phase.rollout.env_steps,
                               generated_tokens=phase.generated_tokens())
        phase.version = report.version
        phase.counters.learner_updated(report)
        phase.lifecycle.learner_updated(report.version, report.groups_trained, report.group_ids)
        await self.events.send(WeightsPublished(
            version=report.version, groups_trained=phase.counters.groups_trained, published_at=trio.current_time()
        ))
        row = metrics_row(report, phase)
        self.metrics.write(row)
        if self.checkpointer is not None:
            self.checkpointer.capture(checkpoint_state(report, phase))
            await self.checkpointer.after_update(report.version)
        if self.progress is not None:
            self.progress.update_line(row, final=True)
        self.heldout.start_if_due(report.version, evals)
        if report.version >= phase.cfg.run.updates:
            phase.done.set()


def metrics_row(report: LearnerReport, phase: Phase) -> dict[str, Any]:
    """One metrics.jsonl row per update; resets the row window (success rate, env steps/s)."""
    counters, rollout = phase.counters, phase.rollout
    now = trio.current_time()
    window_s = max(now - counters.window_started, 1e-9)
    row: dict[str, Any] = {
        "iteration": report.version,
        "wall_s": phase.wall_s(),
        "success_rate": counters.window_successes / counters.window_rollouts if counters.window_rollouts else None,
        "groups_admitted": phase.lifecycle.groups_admitted,
        "groups_cut": counters.groups_cut,
        "groups_trained": counters.groups_trained,
        "groups_dropped_zero_variance": counters.groups_dropped_zero_variance,
        "zero_variance_fraction": counters.merged_zero_variance / counters.merged_full_size if counters.merged_full_size else None,
        "slot_occupancy": phase.slots.occupancy(),
        "env_steps": rollout.env_steps,
        "generated_tokens": phase.generated_tokens(),  # the off-clock curve's token stamp (heldout_curve.stamps)
        "env_steps_per_s": (rollout.env_steps - counters.window_steps_at) / window_s,
        "train_s": report.train_seconds,
        "loop_lag_p99_ms": counters.loop_lag_p99_ms(),
    }
    row |= dict(report.stats)
    window = phase.rollout_wall_s()
    row["trajectory_slot_occupancy"] = rollout.running_seconds() / (phase.slots.total * window) if window > 0 else None
    row |= dict(phase.allocator.statistics())
    if phase.gate is not None:
        row |= dict(phase.gate.statistics())
    counters.window_rollouts = counters.window_successes = 0
    counters.window_steps_at = rollout.env_steps
    counters.window_started = now
    return row


def checkpoint_state(report: LearnerReport, phase: Phase) -> dict[str, Any]:
    """Everything `pipeline.run.resume` saves, at this update boundary (the trainer's state came with the report)."""
    grpo = resume.capture_counters(
        counters=phase.counters, admission=phase.lifecycle.admission, rollout=phase.rollout, version=report.version,
        gate=phase.gate, wall_s=phase.wall_s(),
    )
    grpo["dropped_frames"] = resume.add_counts(phase.counters.resumed_dropped_frames, phase.dropped_frames())
    grpo["ledger"] = phase.counters.ledger.state_dict(
        phase.rollout.running_work(), pacer_held_slot_s=phase.lifecycle.admission.held_slot_seconds(),
        busy_slot_s=phase.slots.busy_seconds())
    return {
        "version": report.version,
        "trainer": report.trainer_state,
        "policy": phase.policy.sampling_state(),
        "allocator": phase.allocator.state_dict(),
        "grpo": grpo,
        "rng": resume.rng_state(),
    }


def live_status(phase: Phase) -> dict[str, Any]:
    """The progress line between updates."""
    counters = phase.counters
    elapsed = max(trio.current_time() - phase.started, 1e-9)
    return {
        "iteration": phase.version,
        "groups_admitted": phase.lifecycle.groups_admitted,
        "groups_cut": counters.groups_cut,
        "groups_trained": counters.groups_trained,
        "slot_occupancy": phase.slots.busy / phase.slots.total,
        "env_steps_per_s": phase.rollout.env_steps / elapsed,
        "success_rate": counters.successes / counters.rollouts_finished if counters.rollouts_finished else None,
        "outstanding": phase.pacer.outstanding,
    }
