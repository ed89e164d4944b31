"""The rollout stage: a cut cancels the whole group at once, closes every episode, abandons in-flight
policy calls; a failing environment fails only its own trajectory."""

from functools import partial

import pytest
import trio
import trio.testing

from pipeline.config import RolloutSection
from pipeline.messages import GroupClosed, GroupOpened, RolloutFailed, StepEvent, TrajectoryStatus
from pipeline.profiling import Profiler
from stages.envs.base import Observation, StepResult, Task
from stages.policy.base import ActResult
from stages.rollout import RolloutStage

TASK = Task(task_id="t0", family="demo", description="count to ten", split="train")
ROLLOUT = RolloutSection(max_error_rate=1.0)
"""The stage with no error-rate stop: these tests fail trajectories on purpose."""


class CountingEnv:
    """Wins after `win_at` steps; raises on reset if told to; records that it was closed."""

    def __init__(self, registry, win_at=3, fail_reset=False):
        self.registry = registry
        self.win_at = win_at
        self.fail_reset = fail_reset
        self.steps = 0
        self.closed = False
        registry.append(self)

    def reset(self, task):
        if self.fail_reset:
            raise RuntimeError("the room is on fire")
        return Observation(text="start", admissible=("count",))

    def step(self, action):
        self.steps += 1
        won = self.steps >= self.win_at
        return StepResult(Observation(text=f"at {self.steps}", admissible=("count",)), float(won), won, won)

    def close(self):
        self.closed = True


class Suite:
    name = "demo"

    def __init__(self, max_steps=30, win_at=3, failing=()):
        self.max_steps = max_steps
        self.win_at = win_at
        self.failing = set(failing)
        self.envs = []

    def make(self):
        return CountingEnv(self.envs, self.win_at, fail_reset=len(self.envs) in self.failing)


class SlowPolicy:
    """Answers every act() after `delay` seconds; counts abandoned calls (the part of `Policy` the stage calls)."""

    version = 7

    def __init__(self, delay=1.0):
        self.delay = delay
        self.abandoned = 0

    async def act(self, context, *, greedy=False):
        try:
            await trio.sleep(self.delay)
        except trio.Cancelled:
            self.abandoned += 1
            raise
        return ActResult(action="count", text="count", prompt_ids=[1], token_ids=[2], logprobs=[-0.1], policy_version=self.version)


def _stage(suite, policy):
    send, receive = trio.open_memory_channel(1000)
    return RolloutStage(suite, policy, {TASK.task_id: TASK}, ROLLOUT, send, profiler=Profiler(enabled=False)), receive


def _drain(receive):
    out = []
    while True:
        try:
            out.append(receive.receive_nowait())
        except trio.WouldBlock:
            return out


async def test_a_complete_group_streams_every_step(autojump_clock):
    suite = Suite(win_at=3)
    stage, receive = _stage(suite, SlowPolicy())
    result = await stage.run_group(1, "t0", 4)
    assert not result.cut
    assert [t.status for t in result.trajectories] == [TrajectoryStatus.COMPLETE] * 4
    assert all(t.success and t.reward == 1.0 and len(t.turns) == 3 for t in result.trajectories)
    events = _drain(receive)
    assert isinstance(events[0], GroupOpened) and isinstance(events[-1], GroupClosed)
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == 12 and sum(e.done for e in steps) == 4
    assert all(e.policy_version == 7 for e in steps)
    assert all(env.closed for env in suite.envs)


async def test_cancel_cuts_the_group_at_once_and_closes_every_episode(autojump_clock):
    suite = Suite(win_at=100)
    policy = SlowPolicy(delay=1.0)
    stage, receive = _stage(suite, policy)
    async with trio.open_nursery() as nursery:
        results = []

        async def run():
            results.append(await stage.run_group(5, "t0", 8))

        nursery.start_soon(run)
        await trio.sleep(3.5)  # every rollout has done 3 steps and waits in act()
        assert stage.running_groups == 1
        assert stage.cancel(5, "converged", 0.05, 3)
        await trio.testing.wait_all_tasks_blocked()
        assert results, "run_group returned as soon as the group was cut"
        assert trio.current_time() == 3.5
    (result,) = results
    assert result.cut and result.cut_reason == "converged" and result.gate_value == 0.05 and result.cut_checkpoint == 3
    assert [t.status for t in result.trajectories] == [TrajectoryStatus.CUT] * 8
    assert all(len(t.turns) == 3 for t in result.trajectories)
    assert policy.abandoned == 8
    assert len(suite.envs) == 8 and all(env.closed for env in suite.envs)
    assert stage.running_groups == 0
    assert not stage.cancel(5, "late", 0.0)  # a late decision is a no-op
    assert isinstance(_drain(receive)[-1], GroupClosed)


async def test_a_failing_environment_fails_one_trajectory_only(autojump_clock):
    suite = Suite(win_at=2, failing={1})
    stage, receive = _stage(suite, SlowPolicy())
    result = await stage.run_group(2, "t0", 3)
    failed = [t.rollout_index for t in result.trajectories if t.status == TrajectoryStatus.ERROR]
    assert len(failed) == 1  # which rollout gets the failing env depends on Trio's task order
    assert sum(t.status == TrajectoryStatus.COMPLETE and t.success for t in result.trajectories) == 2
    assert "the room is on fire" in result.trajectories[failed[0]].error
    assert stage.trajectories_failed == 1
    failures = [e for e in _drain(receive) if isinstance(e, RolloutFailed)]
    assert [(f.group_id, f.rollout_index) for f in failures] == [(2, failed[0])]
    assert all(env.closed for env in suite.envs)


async def test_the_step_limit_ends_an_episode(autojump_clock):
    suite = Suite(max_steps=4, win_at=100)
    stage, _ = _stage(suite, SlowPolicy(delay=0.0))
    result = await stage.run_group(3, "t0", 2)
    assert all(len(t.turns) == 4 and not t.success for t in result.trajectories)


async def test_an_outside_cancel_propagates_and_is_not_a_cut(autojump_clock):
    suite = Suite(win_at=100)
    stage, _ = _stage(suite, SlowPolicy())
    with trio.move_on_after(2.5):
        await stage.run_group(9, "t0", 2)
        pytest.fail("should have been cancelled")
    assert stage.running_groups == 0
    assert all(env.closed for env in suite.envs)


class NoOpEnv(CountingEnv):
    """Every step says "Nothing happens." (and never ends by itself)."""

    def step(self, action):
        self.steps += 1
        return StepResult(Observation(text="Nothing happens.", admissible=("count",)), 0.0, False, False)


class JumpingPolicy(SlowPolicy):
    async def act(self, context, *, greedy=False):
        await super().act(context, greedy=greedy)
        return ActResult(action="jump", text="jump", prompt_ids=[1], token_ids=[2], logprobs=[-0.1], policy_version=self.version)


async def test_step_events_say_whether_the_action_was_admissible_and_the_observation_new(autojump_clock):
    suite = Suite(win_at=3)
    stage, receive = _stage(suite, SlowPolicy(delay=0.0))
    await stage.run_group(1, "t0", 2)
    steps = [e for e in _drain(receive) if isinstance(e, StepEvent)]
    assert all(e.admissible and e.new_observation for e in steps)  # "count" is admissible; "at 1", "at 2"... are new

    looping = Suite(max_steps=3)
    looping.make = lambda: NoOpEnv(looping.envs)
    stage, receive = _stage(looping, JumpingPolicy(delay=0.0))
    await stage.run_group(2, "t0", 1)
    steps = [e for e in _drain(receive) if isinstance(e, StepEvent)]
    assert [(e.admissible, e.new_observation) for e in steps] == [(False, True), (False, False), (False, False)]


class _CancelOnLastClose(Suite):
    """The last episode to close asks for a cut: every member has ended, the group has not returned yet."""

    def __init__(self, stage_box, size):
        super().__init__(win_at=2)
        self.stage_box, self.size, self.closed = stage_box, size, 0

    def make(self):
        env = super().make()
        close = env.close

        def close_and_cut():
            close()
            self.closed += 1
            if self.closed == self.size:
                assert self.stage_box[0].cancel(4, "late", 0.0)  # the group is still registered

        env.close = close_and_cut
        return env


async def test_a_cut_that_finds_every_member_ended_is_not_a_cut(autojump_clock):
    box = []
    suite = _CancelOnLastClose(box, size=3)
    stage, receive = _stage(suite, SlowPolicy())
    box.append(stage)
    result = await stage.run_group(4, "t0", 3)
    assert not result.cut and result.cut_reason == ""
    assert [t.status for t in result.trajectories] == [TrajectoryStatus.COMPLETE] * 3
    assert stage.cuts_late == 1
    closed = _drain(receive)[-1]
    assert isinstance(closed, GroupClosed) and not closed.cut and closed.complete == [True] * 3


async def test_the_admission_kind_and_parent_travel_with_the_group(autojump_clock):
    stage, receive = _stage(Suite(win_at=1), SlowPolicy())
    result = await stage.run_group(6, "t0", 2, kind="commit", parent=5)
    opened = _drain(receive)[0]
    assert (opened.kind, opened.parent) == ("commit", 5)
    assert (result.kind, result.parent) == ("commit", 5)


async def test_steps_record_whether_the_action_was_admissible(autojump_clock):
    stage, _ = _stage(Suite(win_at=2), SlowPolicy())
    result = await stage.run_group(1, "t0", 1)
    assert all(turn.admissible for turn in result.trajectories[0].turns)  # "count" is admissible


async def test_systematic_failures_stop_the_run_naming_the_stage_and_first_error(autojump_clock):
    from pipeline.stage import StageFailed

    suite = Suite(win_at=2, failing=set(range(100)))
    send, _ = trio.open_memory_channel(1000)
    stage = RolloutStage(suite, SlowPolicy(), {TASK.task_id: TASK}, RolloutSection(max_error_rate=0.2, min_trajectories_for_error_rate=5), send,
                         profiler=Profiler(enabled=False))
    async def three_groups():
        for gid in range(3):
            await stage.run_group(gid, "t0", 4)

    with pytest.raises(BaseException) as info:  # noqa: PT011 (StageFailed, possibly inside an exception group)
        await three_groups()
    exc = info.value
    if isinstance(exc, BaseExceptionGroup):
        exc = exc.subgroup(StageFailed).exceptions[0]
    assert isinstance(exc, StageFailed)
    assert "'rollout'" in str(exc) and "the room is on fire" in str(exc) and "max_error_rate" in str(exc)
    assert stage.trajectories_ended >= 5


async def test_a_few_failures_below_the_rate_do_not_stop_the_run(autojump_clock):
    suite = Suite(win_at=2, failing={0})
    send, _ = trio.open_memory_channel(1000)
    stage = RolloutStage(suite, SlowPolicy(), {TASK.task_id: TASK}, RolloutSection(max_error_rate=0.2, min_trajectories_for_error_rate=5), send,
                         profiler=Profiler(enabled=False))
    for gid in range(3):
        await stage.run_group(gid, "t0", 4)
    assert stage.trajectories_failed == 1 and stage.trajectories_ended == 12


class _HangingEnv(CountingEnv):
    """Its second step blocks its thread until released (an environment that hangs)."""

    release = None

    def step(self, action):
        if self.steps == 1:
            _HangingEnv.release.wait(30)
        return super().step(action)


class _HangingSuite(Suite):
    def make(self):
        return _HangingEnv(self.envs, self.win_at)


async def test_a_hanging_step_fails_its_trajectory_at_the_step_timeout():
    """On the real clock: the deadline is the step's own running time, measured in its worker thread, which
    a virtual clock cannot advance."""
    import threading

    _HangingEnv.release = threading.Event()
    suite = _HangingSuite(win_at=5)
    send, _ = trio.open_memory_channel(1000)
    stage = RolloutStage(suite, SlowPolicy(delay=0.0), {TASK.task_id: TASK}, RolloutSection(max_error_rate=1.0, step_timeout_s=0.2), send,
                         profiler=Profiler(enabled=False))
    started = trio.current_time()
    try:
        result = await stage.run_group(1, "t0", 2)
    finally:
        _HangingEnv.release.set()  # let the abandoned threads end
    assert [t.status for t in result.trajectories] == [TrajectoryStatus.ERROR] * 2
    assert all("TooSlowError" in t.error for t in result.trajectories)
    assert stage.trajectories_failed == 2 and all(env.closed for env in suite.envs)
    assert 0.2 <= trio.current_time() - started < 10.0  # failed at the deadline, not when the step returned (30 s)


class _QuickEnv:
    def step(self, action):
        return action


async def test_a_stalled_loop_does_not_fail_a_step_that_returned_in_time():
    """The CI failure of stop 52: under load the loop stalled past a 0.5 s step deadline and three quick
    steps failed as TooSlowError. The deadline is the step's own running time, measured in its thread (wide
    margins: the step only returns its action, so a loaded machine must delay it by 0.5 s to fail it)."""
    import time

    stage = RolloutStage(Suite(), SlowPolicy(), {TASK.task_id: TASK}, RolloutSection(max_error_rate=1.0, step_timeout_s=0.5),
                         profiler=Profiler(enabled=False))

    async def stall_the_loop():
        time.sleep(1.0)  # noqa: ASYNC251  # the loop stalls (the thing under test); the step's thread returns at once

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stall_the_loop)
        assert await stage._env_step(_QuickEnv(), "go") == "go"


async def test_a_step_slower_than_its_deadline_fails_even_when_it_returns():
    import time

    class SlowEnv:
        def step(self, action):
            time.sleep(0.25)  # the slow environment under test, on its worker thread
            return action

    stage = RolloutStage(Suite(), SlowPolicy(), {TASK.task_id: TASK}, RolloutSection(max_error_rate=1.0, step_timeout_s=0.1),
                         profiler=Profiler(enabled=False))
    with pytest.raises(trio.TooSlowError, match=r"rollout.step_timeout_s = 0.1 s"):
        await stage._env_step(SlowEnv(), "go")


async def test_the_stage_validates_cut_decisions_before_applying_them(autojump_clock):
    from pipeline.messages import CancelGroup
    from stages.rollout import GateIdentity

    stage, _ = _stage(Suite(max_steps=30, win_at=100), SlowPolicy())
    stage.gate = GateIdentity("prefix", shadow=False)
    cut = CancelGroup(group_id=0, reason="converged", gate="prefix", value=0.1)
    assert stage._control_problem(cut) == "unknown_group"  # no group started yet
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stage.run_group, 0, TASK.task_id, 2)
        await trio.sleep(0.5)
        assert stage._control_problem(CancelGroup(group_id=0, reason="r", gate="other", value=0.0)) == "unknown_gate"
        assert stage._control_problem(CancelGroup(group_id=0, reason="r", gate="prefix", value=0.0, shadow=True)) == "shadow_mismatch"
        assert stage._control_problem(cut) is None
        stage._apply(cut)
    stage._apply(cut)  # the group returned already: late
    assert stage.cancels_received == 2 and stage.cuts_late == 1
    stage.gate = None
    assert stage._control_problem(cut) == "no_gate"



@pytest.mark.parametrize(("kind", "size"), [("group", 1), ("commit", 4), ("rescue", 2)])
async def test_a_cut_of_a_group_the_gate_never_gates_is_dropped_at_the_control_socket(kind, size):
    """Issue 34: the rollout stage's control PULL applies the gate's own rule (`is_gated`: a prompt's
    first-stage group of size >= 2), so a well-formed cut of a commit / rescue / one-rollout group is
    dropped and counted (`not_gated`) and the group runs on. (Real time: the policy never answers.)"""
    from pipeline.config import TransportSection
    from pipeline.messages import CancelGroup
    from pipeline.stage import StageContext
    from pipeline.transport import open_context
    from stages.rollout import GateIdentity

    stage, _ = _stage(Suite(max_steps=30, win_at=10), SlowPolicy(delay=3600))
    stage.gate = GateIdentity("prefix", shadow=False)
    addresses = TransportSection(control="inproc://rollout-control")
    cut, returned = {}, trio.Event()
    async with open_context() as zmq, trio.open_nursery() as nursery:
        ctx = StageContext(zmq=zmq, addresses=addresses, run_dir=".", profiler=Profiler(enabled=False))
        await nursery.start(stage.run, ctx)

        async def group(gid, **kw):
            cut[gid] = (await stage.run_group(gid, TASK.task_id, **kw)).cut
            returned.set()

        nursery.start_soon(partial(group, 0, size=2))
        nursery.start_soon(partial(group, 1, size=size, kind=kind, parent=0))
        await trio.testing.wait_all_tasks_blocked()
        control = zmq.socket("push", addresses.control, bind=False)
        for gid in (1, 0):  # in order on one socket: the second one's effect shows the first was read
            await control.send(CancelGroup(group_id=gid, reason="converged", gate="prefix", value=0.1))
        with trio.fail_after(10):
            await returned.wait()
        assert cut[0] is True and 1 not in cut and 1 in stage._scopes  # the ungated group runs on
        assert zmq.dropped_frames()["control"] == {"not_gated": 1}
        nursery.cancel_scope.cancel()


class _SignallingPolicy:
    version = 3

    async def act(self, context, *, greedy=False):
        return ActResult(action="count", text="count", prompt_ids=[1], token_ids=[2, 3], logprobs=[-0.25, -0.5],
                         policy_version=self.version, entropy=0.7)


async def test_step_events_carry_the_early_signals_and_the_group_its_prompt_side(autojump_clock):
    task = Task(task_id="t1", family="clean", description="d", split="heldout_unseen", features={"rooms": 2.0})
    send, receive = trio.open_memory_channel(1000)
    stage = RolloutStage(Suite(win_at=2), _SignallingPolicy(), {"t1": task}, ROLLOUT, send, profiler=Profiler(enabled=False))
    await stage.run_group(1, "t1", 2)
    events = _drain(receive)
    opened = events[0]
    assert (opened.family, opened.split, opened.features) == ("clean", "heldout_unseen", {"rooms": 2.0})
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert steps and all(e.logprob == pytest.approx(-0.75) and e.entropy == 0.7 for e in steps)
