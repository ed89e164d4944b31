"""The rollout stage: a group is one prompt x G rollouts, one Trio task per rollout, one nursery per group.

Each rollout runs the agent loop (observation -> policy -> action -> env step) and publishes a `StepEvent`
per step. The group's nursery lives under its own `CancelScope`; `cancel(group_id, ...)` (a gate's
`CancelGroup`) cancels that scope: in-flight policy requests are abandoned (the policy server drops
them), each environment episode is closed in a `finally`, and `run_group` returns at once so the caller
frees the slots. A failing environment or policy call fails that one trajectory, not the group; when
more than `max_error_rate` of the trajectories so far failed (after `min_trajectories` of them), the
stage raises `StageFailed` naming the first exception, so a systematic failure never runs on silently
as a stream of zero rewards.

A group counts as cut only if the cut actually cancelled work (some member was still running): a
`CancelGroup` that arrives after every member ended is late, and the group is reported complete.

Sockets (`run`): the stage owns its steps PUSH (to the gate stage; discarded when no gate runs) and its
control PULL. A `CancelGroup` goes gate -> socket -> `run` -> `cancel`, nothing in between: `run` drops
(and counts on the socket) a decision that cannot be from this run's gate (`no_gate`, `unknown_gate`,
`shadow_mismatch`, `unknown_group`, or `not_gated`: a running group the gate's own rule never gates,
`pipeline.outcomes.is_gated`), counts shadow and late ones, and forwards each applied one to the event
stream. Frames not sealed with the run's secret never get here (`pipeline.transport`: `bad_token`).

Cancellation: only the group's own scope is caught here; a cancel from outside (shutdown) propagates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog
import trio

from pipeline.config import RolloutSection
from pipeline.ledger import Work
from pipeline.messages import (
    AnyMessage,
    CancelGroup,
    ControlStream,
    GroupClosed,
    GroupOpened,
    GroupResult,
    RolloutFailed,
    StepEvent,
    StepStream,
    Trajectory,
    TrajectoryStatus,
    Turn,
)
from pipeline.outcomes import is_gated
from pipeline.profiling import Profiler
from pipeline.stage import StageContext, StageFailed
from stages.envs.base import Environment, EnvSuite, StepResult, Task
from stages.episode import Episode, EpisodeStep, play_episode
from stages.policy.base import Policy

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class _Record:
    """A trajectory under construction; survives cancellation so a cut group still reports its work."""

    rollout_index: int
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    status: TrajectoryStatus = TrajectoryStatus.CUT
    error: str = ""

    def freeze(self) -> Trajectory:
        return Trajectory(
            rollout_index=self.rollout_index,
            turns=self.turns,
            reward=self.reward,
            success=self.success,
            status=self.status,
            error=self.error,
        )


def _tokens(records: list[_Record]) -> int:
    return sum(len(turn.token_ids) for r in records for turn in r.turns)


@dataclass(frozen=True, slots=True)
class _Cut:
    reason: str
    value: float
    checkpoint: int = 0


class _TimedStep:
    """One `env.step` for a worker thread, timed by the thread itself: its deadline is the step's own
    running time, so a loop stalled by other work (a learner holding the GIL, a loaded machine) or a late
    thread start does not fail a step that returned in time. `finished` is set from the thread through the
    loop's token."""

    def __init__(self, env: Environment, action: str) -> None:
        self.env, self.action = env, action
        self.token = trio.lowlevel.current_trio_token()
        self.finished = trio.Event()
        self.started: float | None = None
        self.seconds: float | None = None
        self.result: StepResult | None = None
        self.error: Exception | None = None

    def __call__(self) -> None:
        self.started = time.perf_counter()
        try:
            self.result = self.env.step(self.action)
        except Exception as error:  # handed to the loop, which raises it in the trajectory
            self.error = error
        self.seconds = time.perf_counter() - self.started
        try:
            self.token.run_sync_soon(self.finished.set)
        except trio.RunFinishedError:  # an abandoned step that outlived the run: nobody waits for it
            pass

    def running_for(self) -> float:
        return 0.0 if self.started is None else time.perf_counter() - self.started

    def outcome(self, timeout_s: float) -> StepResult:
        if self.seconds is None or self.seconds > timeout_s:
            raise trio.TooSlowError(f"env.step ran past rollout.step_timeout_s = {timeout_s:g} s")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


@dataclass(frozen=True, slots=True)
class GateIdentity:
    """The gate whose cut decisions this run's rollout stage accepts."""

    name: str
    shadow: bool


class RolloutStage:
    """Runs groups; the caller (the group lifecycle's admission) decides which and when."""

    name = "rollout"

    def __init__(
        self,
        suite: EnvSuite,
        policy: Policy,
        tasks: Mapping[str, Task],
        cfg: RolloutSection,
        steps_out: trio.MemorySendChannel[StepStream] | None = None,
        *,
        profiler: Profiler,
        gate: GateIdentity | None = None,
        events: trio.MemorySendChannel[AnyMessage] | None = None,
        clock: Callable[[], float] = trio.current_time,
        on_trajectory_end: Callable[[], None] | None = None,
    ) -> None:
        """`cfg`: the `[rollout]` section (`max_error_rate`, `min_trajectories_for_error_rate`,
        `step_timeout_s`); the rest is what only the run knows. `steps_out`: where step messages go (None: a
        channel of the stage's own, which `run` forwards to the steps socket). `gate`: whose decisions `run`
        accepts (None: no gate runs, every cut is dropped). `events`: applied cuts are forwarded there (the
        event stream)."""
        self.suite = suite
        self.policy = policy
        self.tasks = tasks
        self._steps_in: trio.MemoryReceiveChannel[StepStream] | None = None
        if steps_out is None:
            steps_out, self._steps_in = trio.open_memory_channel[StepStream](4096)
        self.steps_out = steps_out
        self.gate = gate
        self.events = events
        self.profiler = profiler
        self.clock = clock
        self.step_timeout_s = cfg.step_timeout_s
        self._env_threads = trio.CapacityLimiter(1024)
        self._scopes: dict[int, trio.CancelScope] = {}
        self._gated: set[int] = set()
        """Running groups a gate may cut (`is_gated`); bounded by the running groups."""
        self._cuts: dict[int, _Cut] = {}
        self.on_trajectory_end = on_trajectory_end
        """Called once per trajectory as it ends (complete, failed or cut): frees its slot at once."""
        self.max_error_rate = cfg.max_error_rate
        self.min_trajectories = cfg.min_trajectories_for_error_rate
        self.env_steps = 0
        self.trajectories_ended = 0
        """Trajectories that completed or failed (cut ones are not counted)."""
        self.trajectories_failed = 0
        self.first_error = ""
        self.trajectory_seconds = 0.0
        """Seconds the ended trajectories spent running, summed (`running_seconds` adds the running ones)."""
        self._running = 0
        self._running_since = 0.0
        """How many trajectories run now, and the sum of their start times."""
        self.cuts_late = 0
        """Cut requests that came too late: every member had ended, or the group had returned."""
        self.cancels_received = 0
        self.shadow_cancels = 0
        self._groups_started = 0
        """Group ids below this one were started here (ids ascend)."""
        self._work: dict[int, tuple[list[int], list[_Record]]] = {}
        """Running groups: their env steps so far (one counter) and their records (for their tokens)."""
        self.abandoned = Work()
        """Groups cancelled from outside (the phase ended while they ran): their work, for the ledger's unfinished fate."""

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the control PULL until cancelled (started with the address it bound; groups run through
        `run_group`, their step events leave through `send_steps`)."""
        t = ctx.addresses
        control = ctx.zmq.socket("pull", t.control, bind=True, receives=ControlStream, hwm=t.hwm, name="control")
        async with control:
            task_status.started(control.address)
            async for decision in control:
                reason = self._control_problem(decision)
                if reason is not None:
                    control.drop(reason, f"cancel of group {decision.group_id} by {decision.gate!r}")
                    continue
                self._apply(decision)
                if self.events is not None:
                    await self.events.send(decision)

    async def send_steps(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the steps PUSH, connected to the gate stage at `ctx.addresses.steps` (started once the gate
        runs: its address is where it bound), until cancelled; without a gate the step events are discarded.
        A stage given its own `steps_out` channel sends nothing here."""
        if self._steps_in is None:
            task_status.started()
            return
        async with self._steps_in as steps:
            if self.gate is None:  # nobody listens: discard
                task_status.started()
                async for _ in steps:
                    pass
                return
            push = ctx.zmq.socket("push", ctx.addresses.steps, bind=False, hwm=ctx.addresses.hwm)
            async with push:
                task_status.started()
                async for message in steps:
                    await push.send(message)

    def _control_problem(self, decision: CancelGroup) -> str | None:
        """Why a cut decision cannot be from this run's gate stage (None: apply it)."""
        if self.gate is None:
            return "no_gate"
        if decision.gate != self.gate.name:
            return "unknown_gate"
        if decision.shadow != self.gate.shadow:
            return "shadow_mismatch"
        if not 0 <= decision.group_id < self._groups_started:
            return "unknown_group"
        if decision.group_id in self._scopes and decision.group_id not in self._gated:
            return "not_gated"  # (a group that ended is not known any more: its cut is late, a no-op)
        return None

    def _apply(self, decision: CancelGroup) -> None:
        self.cancels_received += 1
        if decision.shadow:
            self.shadow_cancels += 1
        elif not self.cancel(decision.group_id, decision.reason, decision.value, decision.checkpoint):
            self.cuts_late += 1  # the group had already returned

    @property
    def running_groups(self) -> int:
        return len(self._scopes)

    def cancel(self, group_id: int, reason: str, value: float, checkpoint: int = 0) -> bool:
        """Cut a running group. Returns False if it already ended (a late decision is a no-op)."""
        scope = self._scopes.get(group_id)
        if scope is None:
            return False
        self._cuts[group_id] = _Cut(reason, value, checkpoint)
        scope.cancel()
        return True

    async def run_group(
        self, group_id: int, task_id: str, size: int, *, kind: str = "group", parent: int | None = None
    ) -> GroupResult:
        """Roll out `size` trajectories of `task_id`; returns when all ended or the group was cut."""
        task = self.tasks[task_id]
        started = self.clock()
        self._groups_started = max(self._groups_started, group_id + 1)
        records = [_Record(i) for i in range(size)]
        steps = [0]
        self._work[group_id] = (steps, records)
        returned = False
        try:
            await self.steps_out.send(
                GroupOpened(
                    group_id=group_id, task_id=task_id, size=size, policy_version=self.policy.version,
                    admitted_at=started, kind=kind, parent=parent, family=task.family, split=task.split,
                    features=dict(task.features),
                )
            )
            result = await self._run_members(group_id, task, records, size, kind, parent, started, steps)
            returned = True
            return result
        finally:
            self._work.pop(group_id, None)
            if not returned:  # cancelled from outside: the phase ended while it ran
                self.abandoned.add(Work(1, steps[0], _tokens(records)))

    def running_work(self) -> Work:
        """The work of the groups running now (their env steps and recorded tokens so far)."""
        total = Work()
        for steps, records in self._work.values():
            total.add(Work(1, steps[0], _tokens(records)))
        return total

    async def _run_members(
        self, group_id: int, task: Task, records: list[_Record], size: int, kind: str, parent: int | None, started: float,
        steps: list[int],
    ) -> GroupResult:
        scope = trio.CancelScope()
        self._scopes[group_id] = scope
        if is_gated(kind, size):
            self._gated.add(group_id)
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    for record in records:
                        nursery.start_soon(self._trajectory, group_id, task, record)
        finally:
            del self._scopes[group_id]
            self._gated.discard(group_id)
        cut = self._cuts.pop(group_id, None)
        if cut is not None and not any(r.status == TrajectoryStatus.CUT for r in records):
            cut = None  # every member had already ended: the cut cancelled no work
            self.cuts_late += 1
        result = GroupResult(
            group_id=group_id,
            task_id=task.task_id,
            trajectories=[r.freeze() for r in records],
            cut=cut is not None,
            cut_reason=cut.reason if cut else "",
            gate_value=cut.value if cut else None,
            wall_s=self.clock() - started,
            kind=kind,
            parent=parent,
            env_steps=steps[0],
            cut_checkpoint=cut.checkpoint if cut else 0,
        )
        await self.steps_out.send(
            GroupClosed(
                group_id=group_id,
                rewards=[r.reward for r in records],
                cut=result.cut,
                steps=sum(len(r.turns) for r in records),
                complete=[r.status == TrajectoryStatus.COMPLETE for r in records],
            )
        )
        return result

    async def _trajectory(self, group_id: int, task: Task, record: _Record) -> None:
        started = self.clock()
        self._running += 1
        self._running_since += started
        env: Environment | None = None
        try:
            env = self.suite.make()
            await self._agent_loop(group_id, task, record, env)
            self.trajectories_ended += 1
        except Exception as exc:  # env or policy failure: this trajectory only (Cancelled is not an Exception)
            record.status = TrajectoryStatus.ERROR
            record.error = f"{type(exc).__name__}: {exc}"
            self.trajectories_ended += 1
            self.trajectories_failed += 1
            self.first_error = self.first_error or record.error
            log.warning("rollout.trajectory_failed", group_id=group_id, rollout=record.rollout_index, error=record.error)
            await self.steps_out.send(RolloutFailed(group_id=group_id, rollout_index=record.rollout_index, error=record.error))
            self._check_error_rate()
        finally:
            if env is not None:
                env.close()
            self._running -= 1
            self._running_since -= started
            self.trajectory_seconds += self.clock() - started
            if self.on_trajectory_end is not None:
                self.on_trajectory_end()

    def running_seconds(self) -> float:
        """Seconds trajectories have run so far, summed, those still running included (for trajectory-level
        slot occupancy: a slow policy's trajectories last many seconds, most of a short phase)."""
        return self.trajectory_seconds + self._running * self.clock() - self._running_since

    def _check_error_rate(self) -> None:
        ended, failed = self.trajectories_ended, self.trajectories_failed
        if ended >= self.min_trajectories and failed > self.max_error_rate * ended:
            raise StageFailed(
                self.name,
                f"{failed} of {ended} trajectories failed (more than rollout.max_error_rate = {self.max_error_rate:g}); "
                f"first failure: {self.first_error}",
            )

    async def _env_step(self, env: Environment, action: str) -> StepResult:
        """`env.step`, or with `step_timeout_s` > 0 the same in a worker thread under a deadline: a step that
        hangs fails its trajectory (trio.TooSlowError) and its thread is abandoned; the trajectory's
        `env.close()` follows at once, and an environment whose step can hang should let close() end it.
        The deadline is the step's own running time (`_TimedStep`); the loop's clock bounds the wait at
        twice `step_timeout_s` (a virtual clock, a thread that never starts)."""
        timeout = self.step_timeout_s
        if not timeout:
            return env.step(action)
        step = _TimedStep(env, action)
        with trio.move_on_after(timeout):
            await trio.to_thread.run_sync(step, abandon_on_cancel=True, limiter=self._env_threads)
        with trio.move_on_after(timeout):  # the loop's deadline passed first: the step's own clock decides
            while step.seconds is None and step.running_for() < timeout:
                with trio.move_on_after(timeout - step.running_for()):
                    await step.finished.wait()
        return step.outcome(timeout)

    async def _agent_loop(self, group_id: int, task: Task, record: _Record, env: Environment) -> None:
        group_steps = self._work[group_id][0]

        async def on_step(step: EpisodeStep) -> None:
            self.env_steps += 1
            group_steps[0] += 1
            self.profiler.items("rollout", 1)
            record.reward = step.reward
            await self.steps_out.send(
                StepEvent(
                    group_id=group_id,
                    rollout_index=record.rollout_index,
                    step_index=step.step_index,
                    action=step.turn.action,
                    done=step.done,
                    reward=step.reward,
                    policy_version=step.turn.policy_version,
                    admissible=step.turn.admissible,
                    new_observation=step.new_observation,
                    logprob=float(sum(step.turn.logprobs)),
                    entropy=step.entropy,
                )
            )

        episode = await play_episode(
            self.policy, env, task, self.suite.max_steps, episode=Episode(turns=record.turns),
            env_step=self._env_step, on_step=on_step, profiler=self.profiler,
        )
        record.success = episode.won
        record.status = TrajectoryStatus.COMPLETE
