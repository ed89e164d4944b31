"""Offline gate replay: labels, cut points, savings and the oracle, against hand-counted groups."""

import msgspec
import pytest

from gates import PrefixEditDistanceGate
from gates.calibration import (
    RecordedGroup,
    checkpoint_values,
    first_cut,
    oracle_saved,
    replay_cut,
    saved_after,
    score,
)
from pipeline.messages import RolloutFailed, StepEvent


def _group(actions: list[list[str]], rewards: list[float], *, complete=None, tokens_per_step: int = 2,
           failed: tuple[int, ...] = ()) -> RecordedGroup:
    """Members step in lockstep (member 0 first at each step); a member in `failed` fails after its steps."""
    events: list = []
    longest = max(len(a) for a in actions)
    for s in range(longest):
        for r, acts in enumerate(actions):
            if s < len(acts):
                done = s == len(acts) - 1 and r not in failed
                events.append(StepEvent(group_id=7, rollout_index=r, step_index=s, action=acts[s], done=done,
                                        reward=rewards[r] if done else 0.0, policy_version=0))
    events += [RolloutFailed(group_id=7, rollout_index=r, error="boom") for r in failed]
    return RecordedGroup(
        task_id="t", seed=0, events=events,
        tokens=[[tokens_per_step] * len(a) for a in actions], rewards=rewards,
        complete=complete if complete is not None else [r not in failed for r in range(len(actions))],
    )


SAME = ["go to desk 1"] * 12
OTHER = [f"go to shelf {i}" for i in range(12)]


def test_label_is_zero_variance_over_complete_members_only():
    assert _group([SAME, SAME], [0.0, 0.0]).label() is True
    assert _group([SAME, SAME], [0.0, 1.0]).label() is False
    # The failed member's 1.0 does not count: the two complete members agree.
    assert _group([SAME, SAME, SAME], [0.0, 0.0, 1.0], failed=(2,)).label() is True
    assert _group([SAME, SAME], [0.0, 1.0], failed=(1,)).label() is None


def test_replay_cuts_when_the_last_member_reaches_k_and_saves_the_rest():
    group = _group([SAME, SAME], [0.0, 0.0])
    cut = replay_cut(PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=10, tau=0.5)), group)
    assert cut == 19  # member 1's 10th step is event 2 * 10 - 1
    assert saved_after(group, cut) == (4, 8)  # steps 11 and 12 of both members, 2 tokens each
    assert saved_after(group, None) == (0, 0)


def test_never_cut_replay_records_every_checkpoint_and_first_cut_agrees_with_the_real_gate():
    group = _group([SAME, SAME[:6] + OTHER[6:]], [0.0, 0.0])  # d_5 = 0, d_10 = 0.4
    values = checkpoint_values(PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=5, tau=0.0, checkpoints=[10])), group)
    assert [(c.k, round(c.value, 2)) for c in values] == [(5, 0.0), (10, 0.4)]
    for tau, ks in [(0.3, (10,)), (0.5, (10,)), (0.1, (5, 10)), (0.0, (5, 10))]:
        real = replay_cut(PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=min(ks), tau=tau, checkpoints=list(ks))), group)
        assert first_cut(values, tau, ks) == real


def test_a_cutting_gate_in_a_never_cut_replay_is_refused():
    with pytest.raises(ValueError, match="not a threshold gate"):
        checkpoint_values(PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=5, tau=0.5)), _group([SAME, SAME], [0.0, 0.0]))


def test_oracle_counts_steps_beyond_k():
    group = _group([SAME, SAME[:7]], [0.0, 0.0], tokens_per_step=3)
    assert oracle_saved(group, 5) == (7 + 2, 27)


def test_score_counts_precision_recall_savings_and_cost_ratio():
    zero = _group([SAME, SAME], [0.0, 0.0])  # 24 steps, positive
    mixed = _group([SAME, SAME], [0.0, 1.0])  # 24 steps, negative
    unlabelled = _group([SAME, SAME], [0.0, 1.0], failed=(1,))
    groups = [zero, mixed, mixed, unlabelled]
    s = score(groups, [19, 19, None, None], oracle_k=10)
    assert (s.tp, s.fp, s.fn, s.tn) == (1, 1, 0, 1)
    assert s.precision == 0.5 and s.recall == 1.0
    assert s.steps_saved == pytest.approx(8 / 96)
    assert s.oracle_steps_saved == pytest.approx(4 / 96)
    # Ungated: 96 steps for 2 informative groups; gated: 88 steps for the 1 kept.
    assert s.cost_ratio == pytest.approx((88 / 1) / (96 / 2))


def test_score_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 groups but 1"):
        score([_group([SAME, SAME], [0.0, 0.0])] * 2, [None], oracle_k=10)


def test_recorded_groups_round_trip_through_msgpack():
    group = _group([SAME, SAME[:3]], [0.0, 1.0], failed=(1,))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode([group]), type=list[RecordedGroup]) == [group]
