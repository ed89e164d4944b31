"""The gate stage over real ZMQ sockets: step events in, CancelGroup out, bad frames survived."""

import trio

from pipeline.config import TransportSection
from pipeline.messages import CancelGroup, ControlStream, GroupClosed, GroupOpened, StepEvent
from pipeline.profiling import Profiler
from pipeline.stage import StageContext, build_stage
from pipeline.transport import open_context
from stages.gate_stage import GateStage

ACTIONS = [f"go to cabinet {i}" for i in range(10)]


def _steps(gid, sequences):
    for s in range(10):
        for r, seq in enumerate(sequences):
            yield StepEvent(group_id=gid, rollout_index=r, step_index=s, action=seq[s], done=False, reward=0.0, policy_version=0)


async def _run_gate(stage, messages, bad_frames=0, expect=1, until=lambda: True):
    addresses = TransportSection(steps="inproc://gs-steps", control="inproc://gs-control")
    async with open_context() as zmq:
        control = zmq.socket("pull", addresses.control, bind=True, receives=ControlStream)
        ctx = StageContext(zmq=zmq, addresses=addresses, run_dir=".", profiler=Profiler(enabled=False))
        decisions = []
        async with trio.open_nursery() as nursery:
            await nursery.start(stage.run, ctx)
            steps = zmq.socket("push", addresses.steps, bind=False)
            for _ in range(bad_frames):
                await steps.send_bytes(b"\x93not a message")
            for message in messages:
                await steps.send(message)
            with trio.fail_after(10):
                while len(decisions) < expect:
                    decisions.append(await control.receive())
                while not until():  # noqa: ASYNC110 (the stage runs in this nursery; poll its state)
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    return decisions


async def test_converged_group_is_cut_and_diverse_group_is_not():
    converged = [ACTIONS] * 8
    diverse = [[f"open drawer {r * 10 + s}" for s in range(10)] for r in range(8)]
    messages = [GroupOpened(group_id=1, task_id="a", size=8, policy_version=0, admitted_at=0.0),
                GroupOpened(group_id=2, task_id="b", size=8, policy_version=0, admitted_at=0.0),
                *_steps(2, diverse), *_steps(1, converged)]
    stage = GateStage(k=10, tau=0.12)
    (decision,) = await _run_gate(stage, messages, bad_frames=3)
    assert isinstance(decision, CancelGroup)
    assert decision.group_id == 1 and decision.value == 0.0 and decision.gate == "prefix_edit_distance"
    assert not decision.shadow
    stats = stage.statistics()
    assert stats["gate/decisions"] == 2 and stats["gate/cut_decisions"] == 1


async def test_shadow_mode_flags_decisions_and_scores_closed_groups():
    messages = [GroupOpened(group_id=1, task_id="a", size=8, policy_version=0, admitted_at=0.0),
                *_steps(1, [ACTIONS] * 8),
                GroupClosed(group_id=1, rewards=[0.0] * 8, cut=False, steps=80)]
    stage = build_stage("gate", {"k": 10, "tau": 0.12, "shadow": True})
    (decision,) = await _run_gate(stage, messages, until=lambda: stage.ledger.groups > 0)
    assert decision.shadow
    assert stage.ledger.true_positive == 1
