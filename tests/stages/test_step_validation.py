"""The gate stage's step-stream validation: consistent streams pass untouched, every inconsistency is
dropped with its reason, and a disputed group is never decided on."""

from pipeline.messages import CancelGroup, GroupClosed, GroupOpened, RolloutFailed, StepEvent
from stages.step_validation import StepValidator


def _open(gid: int, size: int = 2) -> GroupOpened:
    return GroupOpened(group_id=gid, task_id="t", size=size, policy_version=0, admitted_at=0.0)


def _step(gid: int, r: int, i: int, done: bool = False) -> StepEvent:
    return StepEvent(group_id=gid, rollout_index=r, step_index=i, action="a", done=done, reward=0.0, policy_version=0)


def test_a_consistent_stream_passes():
    v = StepValidator()
    stream = [_open(0), _step(0, 0, 0), _step(0, 1, 0), _step(0, 0, 1, done=True),
              RolloutFailed(group_id=0, rollout_index=1, error="x"), GroupClosed(group_id=0, rewards=[0.0, 1.0], cut=False, steps=3)]
    assert [v.check(m) for m in stream] == [None] * len(stream)
    assert v.open_groups == 0


def test_every_inconsistency_has_its_reason():
    v = StepValidator(max_open=2)
    assert v.check(_open(0)) is None and v.check(_step(0, 0, 0)) is None
    cases = {
        "unknown_group": _step(7, 0, 0),
        "rollout_index_out_of_range": _step(0, 99, 0),
        "duplicate_step": _step(0, 0, 0),
        "step_out_of_order": _step(0, 0, 5),
        "bad_group_id": _open(-1),
        "bad_group_size": _open(3, size=0),
        "bad_rewards": GroupClosed(group_id=0, rewards=[1.0], cut=False, steps=1),
        "bad_complete": GroupClosed(group_id=0, rewards=[1.0] * 2, cut=False, steps=1, complete=[True]),
        "unexpected_message": CancelGroup(group_id=0, reason="", gate="g", value=0.0),
    }
    for reason, message in cases.items():
        assert v.check(message) == reason, reason
    assert v.check(_step(0, -1, 0)) == "rollout_index_out_of_range"
    assert v.check(_step(0, 1, 0, done=True)) is None
    assert v.check(_step(0, 1, 1)) == "after_rollout_end"
    assert v.check(_open(1)) is None
    assert v.check(_open(2)) == "too_many_open_groups"  # forged opens cannot grow memory without bound


def test_a_second_open_of_the_same_group_poisons_it_until_it_closes():
    v = StepValidator()
    assert v.check(_open(4)) is None
    assert v.check(_open(4, size=3)) == "duplicate_group"
    assert v.poisoned(4)
    assert v.check(_step(4, 0, 0)) == "poisoned_group"
    assert v.check(GroupClosed(group_id=4, rewards=[0.0, 0.0], cut=False, steps=0)) is None
    assert not v.poisoned(4) and v.open_groups == 0
