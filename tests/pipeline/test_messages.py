"""Every wire message survives encode -> decode unchanged, through its stream's union."""

import msgspec
import pytest

from pipeline.messages import (
    AbandonRequest,
    ActReply,
    ActRequest,
    AnyMessage,
    CancelGroup,
    FramesDropped,
    GateReport,
    GroupClosed,
    GroupDropped,
    GroupExpected,
    GroupOpened,
    GroupResult,
    LearnerDropped,
    LearnerInbox,
    LearnerUpdated,
    LoadWeights,
    Metrics,
    PhaseFinished,
    ReportStream,
    RolloutFailed,
    StageReady,
    StepEvent,
    Trajectory,
    TrajectoryStatus,
    Turn,
    WeightsPublished,
    WorkerInbox,
    WorkerOutbox,
)

EXAMPLES = [
    GroupOpened(group_id=1, task_id="household/train/000001", size=8, policy_version=3, admitted_at=1.5),
    StepEvent(group_id=1, rollout_index=2, step_index=0, action="go to fridge 1", done=False, reward=0.0, policy_version=3),
    RolloutFailed(group_id=1, rollout_index=3, error="ValueError('bad room')"),
    GroupClosed(group_id=1, rewards=[0.0, 1.0], cut=False, steps=17),
    CancelGroup(group_id=1, reason="converged", gate="prefix_edit_distance", value=0.1, shadow=True),
    GroupResult(
        group_id=1,
        task_id="t",
        trajectories=[
            Trajectory(
                rollout_index=0,
                turns=[Turn(prompt_ids=[1, 2], token_ids=[3], logprobs=[-0.5], action="look", policy_version=3)],
                reward=1.0,
                success=True,
                status=TrajectoryStatus.COMPLETE,
            ),
            Trajectory(rollout_index=1, turns=[], reward=0.0, success=False, status=TrajectoryStatus.ERROR, error="boom"),
        ],
        cut=True,
        cut_reason="d<tau",
        gate_value=0.05,
        wall_s=2.0,
    ),
    WeightsPublished(version=4, groups_trained=32, published_at=10.0),
    Metrics(stage="learner", values={"learner/loss": 0.25}),
    PhaseFinished(updates=10, stop_reason="updates"),
    GroupDropped(group_id=7, reason="all_fail"),
]

WORKER_EXAMPLES = [
    (ActRequest(request_id=7, task="t", observation="o", admissible=["look"], history=[("o0", "a0")], greedy=False, number=3), WorkerInbox),
    (AbandonRequest(request_id=7), WorkerInbox),
    (LoadWeights(version=2, weights=b"\x00\x01"), WorkerInbox),
    (ActReply(request_id=7, worker=1, action="look", text="look", prompt_ids=[1], token_ids=[2, 3], logprobs=[-0.1, -0.2], policy_version=2), WorkerOutbox),
    (StageReady(stage="decoder", worker=1), WorkerOutbox),
    (GroupExpected(group_id=4), LearnerInbox),
    (StageReady(stage="gate", gate="prefix_edit_distance", shadow=True), ReportStream),
    (LearnerUpdated(version=2, stats={"learner/loss": 0.1}, train_seconds=1.5, groups_trained=8, weights=b"w", trainer_state=b"s"), ReportStream),
    (LearnerDropped(zero_variance=True), ReportStream),
    (LearnerDropped(zero_variance=True, group_id=3, reason="all_succeed"), ReportStream),
    (GateReport(statistics={"gate/decisions": 3.0, "gate/us_per_decision": None}, counters={"cuts": 1, "groups_by_kind": {"group": 2}}), ReportStream),
    (GateReport(statistics={"gate/decisions/group": 3, "gate/us_per_decision": 41.5}, counters={}, final=True), ReportStream),
    (FramesDropped(stage="learner", counts={"results": {"bad_token": 3, "unknown_group": 1}}), ReportStream),
]


@pytest.mark.parametrize(("message", "union"), WORKER_EXAMPLES, ids=lambda m: type(m).__name__)
def test_worker_messages_round_trip(message, union):
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(message), type=union) == message


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip_through_the_union(message):
    frame = msgspec.msgpack.encode(message)
    assert msgspec.msgpack.decode(frame, type=AnyMessage) == message


def test_every_message_type_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(AnyMessage.__args__)


def test_messages_are_frozen():
    with pytest.raises(AttributeError):
        EXAMPLES[0].group_id = 2  # type: ignore[misc]


def test_a_new_optional_field_still_decodes_old_frames():
    class StepEventV2(msgspec.Struct, frozen=True, tag="StepEvent", kw_only=True):
        group_id: int
        rollout_index: int
        step_index: int
        action: str
        done: bool
        reward: float
        policy_version: int
        latency_s: float = 0.0

    old = msgspec.msgpack.encode(EXAMPLES[1])
    assert msgspec.msgpack.decode(old, type=StepEventV2).latency_s == 0.0


def test_a_gate_report_keeps_its_counts_ints():
    frame = msgspec.msgpack.encode(GateReport(statistics={"gate/decisions": 3, "gate/us_per_decision": 41.5}, counters={}))
    back = msgspec.msgpack.decode(frame, type=ReportStream)
    assert type(back.statistics["gate/decisions"]) is int and back.statistics["gate/us_per_decision"] == 41.5
    assert back.final is False  # periodic unless the gate process says it is its last
