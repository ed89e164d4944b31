"""The gate stage over real ZMQ sockets: step events in, CancelGroup out, bad frames survived."""

import dataclasses

import pytest
import trio

from gates import build_gate
from pipeline import tensors
from pipeline.config import TransportSection
from pipeline.messages import CancelGroup, ControlStream, GroupClosed, GroupOpened, StepEvent
from pipeline.profiling import Profiler
from pipeline.stage import StageContext, build_stage
from pipeline.transport import open_context
from stages.gate_stage import GateStage

ACTIONS = [f"go to cabinet {i}" for i in range(10)]


def _prefix_gate():
    return build_gate("prefix_edit_distance", {"k": 10, "tau": 0.12})


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
    stage = GateStage(_prefix_gate())
    (decision,) = await _run_gate(stage, messages, bad_frames=3)
    assert isinstance(decision, CancelGroup)
    assert decision.group_id == 1 and decision.value == 0.0 and decision.gate == "prefix_edit_distance"
    assert decision.checkpoint == 10  # the gate's K: where it decided, carried to the cut group's result
    assert not decision.shadow
    stats = stage.statistics()
    assert stats["gate/decisions"] == 2 and stats["gate/cut_decisions"] == 1


async def test_shadow_mode_flags_decisions_and_scores_closed_groups():
    messages = [GroupOpened(group_id=1, task_id="a", size=8, policy_version=0, admitted_at=0.0),
                *_steps(1, [ACTIONS] * 8),
                GroupClosed(group_id=1, rewards=[0.0] * 8, cut=False, steps=80)]
    stage = build_stage("gate", {"gate": "prefix_edit_distance", "k": 10, "tau": 0.12, "shadow": True})
    (decision,) = await _run_gate(stage, messages, until=lambda: stage.ledger.groups > 0)
    assert decision.shadow
    assert stage.ledger.true_positive == 1


class _Ctx:
    profiler = Profiler(enabled=False)


def _feed(stage, messages):
    return [d for m in messages if (d := stage._handle(m, _Ctx())) is not None]


def _opened(gid, size, kind="group", parent=None):
    return GroupOpened(group_id=gid, task_id="a", size=size, policy_version=0, admitted_at=0.0, kind=kind, parent=parent)


def test_only_a_prompts_first_stage_group_of_two_or_more_is_gated():
    stage = GateStage(_prefix_gate())
    messages = [
        _opened(1, 4, "pilot"), *_steps(1, [ACTIONS] * 4),  # converged pilot: gated and cut
        _opened(2, 4, "commit", parent=1), *_steps(2, [ACTIONS] * 4),  # converged commit: never gated
        _opened(3, 2, "rescue", parent=1), *_steps(3, [ACTIONS] * 2),
        _opened(4, 1, "group"), *_steps(4, [ACTIONS]),  # one rollout: no pairs, no decision
    ]
    cuts = _feed(stage, messages)
    assert [c.group_id for c in cuts] == [1]
    stats = stage.statistics()
    assert stats["gate/decisions/pilot"] == 1 and "gate/decisions/commit" not in stats
    assert stats["gate/groups_seen/commit"] == 1 and stats["gate/groups_gated"] == 1
    assert stats.decisions_by_kind == {"pilot": 1} and stats.groups_gated == 1  # the same figures, as fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.decisions = 0  # a record of one moment
    counters = stage.counters_state()
    restored = GateStage(_prefix_gate())
    restored.load_counters(counters)
    back = restored.statistics()  # a resumed run's counters (open groups are not carried over)
    assert (back.decisions, back.groups_seen, back.decisions_by_kind) == (stats.decisions, stats.groups_seen, stats.decisions_by_kind)


def test_shadow_labels_use_the_prompts_merged_group_and_leave_failed_rollouts_out():
    stage = GateStage(_prefix_gate(), shadow=True)
    messages = [
        # pilot: converged and all-fail on its own (would cut) ...
        _opened(1, 4, "pilot"), *_steps(1, [ACTIONS] * 4),
        GroupClosed(group_id=1, rewards=[0.0] * 4, cut=False, steps=40),
        # ... but its commit group won once: the prompt was informative, so the would-be cut is a false positive
        _opened(2, 4, "commit", parent=1),
        GroupClosed(group_id=2, rewards=[0.0, 1.0, 0.0, 0.0], cut=False, steps=40),
        # a plain group whose only win came from a rollout that then failed: all-fail among complete ones
        _opened(3, 3, "group"), *_steps(3, [ACTIONS] * 3),
        GroupClosed(group_id=3, rewards=[0.0, 1.0, 0.0], cut=False, steps=30, complete=[True, False, True]),
    ]
    assert len(_feed(stage, messages)) == 2
    stage.finish()
    assert (stage.ledger.true_positive, stage.ledger.false_positive) == (1, 1)


def test_a_merged_group_with_one_complete_reward_is_unlabelled_online_as_offline():
    from gates.calibration import RecordedGroup

    stage = GateStage(_prefix_gate(), shadow=True)
    messages = [
        # converged (would cut) but one of its two rollouts failed: one complete reward, no pair to compare
        _opened(1, 2, "group"), *_steps(1, [ACTIONS] * 2),
        GroupClosed(group_id=1, rewards=[0.0, 0.0], cut=False, steps=20, complete=[True, False]),
        _opened(2, 2, "group"), *_steps(2, [ACTIONS] * 2),  # the same with both complete: a true positive
        GroupClosed(group_id=2, rewards=[0.0, 0.0], cut=False, steps=20),
    ]
    assert len(_feed(stage, messages)) == 2
    stage.finish()
    ledger = stage.ledger
    assert (ledger.true_positive, ledger.false_positive, ledger.false_negative, ledger.true_negative) == (1, 0, 0, 0)
    assert stage.statistics()["gate/shadow_unlabelled"] == 1
    offline = RecordedGroup(task_id="a", seed=0, events=[], tokens=[[], []], rewards=[0.0, 0.0], complete=[True, False])
    assert offline.label() is None  # the calibration leaves the same group unlabelled


def test_prefix_decide_with_fewer_than_two_rollouts_is_no_decision():
    from gates.prefix import decide

    decision = decide([["look"] * 10], 10, 0.6)
    assert not decision.cut and "no decision" in decision.reason


def test_a_learning_gate_gets_the_prompt_side_and_labels_but_never_a_cut_groups():
    from gates.zero_variance import ZeroVarianceGate

    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=100))
    stage = GateStage(gate)
    assert stage.learning is gate
    opened = [GroupOpened(group_id=g, task_id=f"t{g}", size=2, policy_version=0, admitted_at=0.0, family="clean",
                          split="train", features={"rooms": 2.0}) for g in (1, 2)]
    _feed(stage, opened)
    assert gate._task_names == ["rooms"] and gate._groups[1].family == "clean"
    _feed(stage, [GroupClosed(group_id=1, rewards=[0.0, 0.0], cut=False, steps=4),
                  GroupClosed(group_id=2, rewards=[0.0, 0.0], cut=True, steps=4)])
    assert gate.unbiased_labels == 1  # group 1 only: group 2 was cut, its label is never asked for
    assert stage.statistics()["gate/zv/unbiased_labels"] == 1


async def test_the_stage_runs_a_learning_gates_refits_beside_its_loop():
    from gates.zero_variance import ZeroVarianceGate

    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=100, refit_every=1))
    fitted = []
    gate.fit = lambda xs, ys, settings: fitted.append(len(ys))
    stage = GateStage(gate)
    messages = [GroupOpened(group_id=1, task_id="t", size=2, policy_version=0, admitted_at=0.0),
                GroupClosed(group_id=1, rewards=[1.0, 0.0], cut=False, steps=2)]
    await _run_gate(stage, messages, expect=0, until=lambda: gate.refits == 1)
    assert fitted == [1] + [0] * len(gate.checkpoints)  # admission's row; no step reached a checkpoint


def test_a_learning_gate_s_state_is_kept_with_the_stage_s_counters():
    """Issue 57: a resumed run's zero-variance gate starts from what it had learned, not afresh."""
    stage = GateStage(build_gate("zero_variance", {"warmup": 8}))
    stage.learning.unbiased_labels = 9
    stage.learning._families["f"] = (3.0, 8.0)
    counters = stage.counters_state()
    assert counters["learning"]["counts"]["unbiased_labels"] == 9
    counters = tensors.unpack(tensors.pack(counters))  # as the checkpoint file carries it
    restored = GateStage(build_gate("zero_variance", {"warmup": 8}))
    restored.load_counters(counters)
    assert restored.learning.warmed_up and restored.learning.family_success("f") == stage.learning.family_success("f")
    assert "learning" not in GateStage(_prefix_gate()).counters_state()  # a gate that learns nothing keeps nothing
