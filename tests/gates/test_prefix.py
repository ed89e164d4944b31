"""The prefix edit-distance gate against the hand-derived vectors of selective_rollout.md §4."""

from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates import END, PrefixEditDistanceGate, ShadowLedger, decide, mean_prefix_edit_distance
from pipeline.messages import StepEvent

BASE = [f"go to cabinet {i}" for i in range(1, 11)]  # K = 10 distinct actions


def _with_substitutions(n: int) -> list[str]:
    return [f"open drawer {i}" if i < n else a for i, a in enumerate(BASE)]


def test_identical_prefixes_give_zero_and_cut():
    assert mean_prefix_edit_distance([BASE] * 8, 10) == 0.0
    assert decide([BASE] * 8, 10, 0.12).cut


def test_seven_identical_and_one_with_four_substitutions_is_cut():
    d = mean_prefix_edit_distance([BASE] * 7 + [_with_substitutions(4)], 10)
    assert d == pytest.approx(7 * 0.4 / 28) == pytest.approx(0.100)
    assert decide([BASE] * 7 + [_with_substitutions(4)], 10, 0.12).cut


def test_five_substitutions_is_kept():
    groups = [BASE] * 7 + [_with_substitutions(5)]
    assert mean_prefix_edit_distance(groups, 10) == pytest.approx(0.125)
    assert not decide(groups, 10, 0.12).cut


def test_boundary_is_strict():
    groups = [BASE] * 7 + [_with_substitutions(4)]
    assert not decide(groups, 10, 0.1).cut  # d == tau is kept


def test_early_finisher_is_padded_with_end():
    groups = [BASE] * 7 + [BASE[:6]]  # finished at step 6: four <END> pads
    assert mean_prefix_edit_distance(groups, 10) == pytest.approx(0.100)


def test_shifted_sequence_costs_two_not_k():
    shifted = BASE[1:] + [END]
    assert mean_prefix_edit_distance([BASE, shifted], 10) == pytest.approx(2 / 10)


def test_only_the_first_k_actions_count():
    tail_differs = [BASE + ["look"], BASE + ["inventory", "look"]]
    assert mean_prefix_edit_distance(tail_differs, 10) == 0.0


def test_fewer_than_two_rollouts_have_no_pairs():
    assert mean_prefix_edit_distance([BASE], 10) == 0.0


def _levenshtein(a: list[str], b: list[str]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def _reference(actions: list[list[str]], k: int) -> float:
    pads = [list(a[:k]) + [END] * (k - len(a[:k])) for a in actions]
    pairs = list(combinations(range(len(pads)), 2))
    return sum(_levenshtein(pads[i], pads[j]) / k for i, j in pairs) / len(pairs)


ACTIONS = st.sampled_from(["look", "go to fridge 1", "open fridge 1", "take mug 1 from fridge 1", "inventory", "x"])


@given(st.lists(st.lists(ACTIONS, max_size=14), min_size=2, max_size=9), st.integers(1, 12))
def test_matches_a_plain_dynamic_programming_levenshtein(actions, k):
    assert mean_prefix_edit_distance(actions, k) == pytest.approx(_reference(actions, k))


# -- the streaming gate -----------------------------------------------------------------------------


def _event(gid, r, s, action, done=False):
    return StepEvent(group_id=gid, rollout_index=r, step_index=s, action=action, done=done, reward=0.0, policy_version=0)


def _feed(gate, gid, sequences, done_at_end=()):
    """Interleave steps round-robin as a live group would; returns the decisions observed."""
    out = []
    for s in range(max(len(x) for x in sequences)):
        for r, seq in enumerate(sequences):
            if s < len(seq):
                d = gate.observe(_event(gid, r, s, seq[s], done=(r in done_at_end and s == len(seq) - 1)))
                if d is not None:
                    out.append((s, r, d))
    return out


def test_gate_decides_once_when_every_member_reaches_k():
    gate = PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=10, tau=0.12))
    gate.open(1, 8)
    decisions = _feed(gate, 1, [BASE + ["look"] * 5] * 8)
    assert len(decisions) == 1
    step, rollout, decision = decisions[0]
    assert (step, rollout) == (9, 7) and decision.cut and decision.value == 0.0


def test_gate_waits_for_slow_members_but_not_for_ended_ones():
    gate = PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=10, tau=0.12))
    gate.open(1, 3)
    decisions = _feed(gate, 1, [BASE, BASE, BASE[:4]], done_at_end={2})
    (step, rollout, decision), = decisions
    assert (step, rollout) == (9, 1)  # the ended member did not hold the decision back
    assert decision.value == pytest.approx((0 + 6 + 6) / 3 / 10) and not decision.cut


def test_gate_never_evaluates_when_all_ended_before_k():
    gate = PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=10, tau=0.12))
    gate.open(1, 2)
    assert _feed(gate, 1, [BASE[:3], BASE[:5]], done_at_end={0, 1}) == []
    assert gate.close(1) == []


def test_checkpoints_are_evaluated_in_order_until_a_cut():
    diverse = [[f"a{r}{i}" for i in range(4)] + ["look"] * 20 for r in range(4)]
    gate = PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=4, tau=0.3, checkpoints=[24]))
    gate.open(1, 4)
    decisions = [d for _, _, d in _feed(gate, 1, diverse)]
    assert [(d.checkpoint, d.cut) for d in decisions] == [(4, False), (24, True)]
    assert [d.checkpoint for d in gate.close(1)] == [4, 24]


def test_unknown_groups_are_ignored():
    gate = PrefixEditDistanceGate()
    assert gate.observe(_event(99, 0, 0, "look")) is None


def test_shadow_ledger_precision_and_recall():
    ledger = ShadowLedger()
    ledger.record(True, [0, 0, 0])  # TP
    ledger.record(True, [0, 1, 0])  # FP
    ledger.record(False, [1, 1, 1])  # FN
    ledger.record(False, [0, 1, 1])  # TN
    ledger.record(True, [1, 1])  # TP
    assert ledger.precision() == pytest.approx(2 / 3)
    assert ledger.recall() == pytest.approx(2 / 3)
    assert ShadowLedger().precision() is None


def test_shadow_ledger_leaves_fewer_than_two_complete_rewards_unlabelled():
    ledger = ShadowLedger()
    ledger.record(True, [0.0])  # one complete member: no pair, no label (was a true positive)
    ledger.record(False, [])  # every member failed
    ledger.record(True, [0.0, 0.0])
    assert (ledger.true_positive, ledger.false_negative, ledger.groups, ledger.unlabelled) == (1, 0, 1, 2)
    assert ledger.as_dict()["gate/shadow_unlabelled"] == 2


def test_an_index_outside_the_group_is_ignored_not_an_index_error():
    from pipeline.messages import StepEvent

    gate = PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=1, tau=0.5))
    gate.open(0, 2)
    for r in (99, -1):
        event = StepEvent(group_id=0, rollout_index=r, step_index=0, action="a", done=False, reward=0.0, policy_version=0)
        assert gate.observe(event) is None
