"""The predictor's features as pure functions of the members' steps before k."""

import math

import pytest

from gates.prefix import mean_prefix_edit_distance
from gates.zero_variance_features import STEP_FEATURES, MemberSteps, prompt_vector, step_vector
from pipeline.messages import StepEvent

TABLE: dict[str, str] = {}  # one group's action codes (every member of a test's group shares them)


def _member(actions: str, *, ok: str = "", new: str = "", logprobs=(), entropies=(), done: bool = False) -> MemberSteps:
    m = MemberSteps(TABLE)
    for s, a in enumerate(actions):
        m.add(StepEvent(group_id=0, rollout_index=0, step_index=s, action=a, done=done and s == len(actions) - 1,
                        reward=0.0, policy_version=0, admissible=(ok[s] == "1") if ok else True,
                        new_observation=(new[s] == "1") if new else True,
                        logprob=logprobs[s] if logprobs else None, entropy=entropies[s] if entropies else None))
    return m


def test_step_features_at_k():
    a = _member("abcd", ok="1101", new="1100", logprobs=[-1, -1, -3, -3], entropies=[2, 2, 1, 1])
    b = _member("abxy", logprobs=[-1] * 4, entropies=[1] * 4)
    c = _member("ab", done=True)  # ended before k = 4
    f = dict(zip(STEP_FEATURES, step_vector([a, b, c], 4, window=2), strict=True))
    assert f["progress"] == pytest.approx((0 + 2) / 4)  # a's last 2 steps: (ok, new) = (0,0), (1,0); b's: 2
    assert f["ended"] == pytest.approx(1 / 3)
    assert f["admissible"] == pytest.approx((3 + 4 + 2) / 10)
    assert f["new_observation"] == pytest.approx((2 + 4 + 2) / 10)
    assert f["prefix_distance"] == pytest.approx(mean_prefix_edit_distance(["abcd", "abxy", "ab"], 4))
    assert f["agreement"] == pytest.approx(1 / 3)  # latest actions d, y, b
    assert f["logprob"] == pytest.approx((-8 - 4 + 0) / 10)
    assert f["logprob_trend"] == pytest.approx((-2 + 0 + 0) / 3)  # a: -3 - (-1); b: 0; c: 0
    assert f["entropy_trend"] == pytest.approx((-1 + 0 + 0) / 3)


def test_only_steps_before_k_count():
    a, b = _member("aaaa"), _member("aabb")
    early = dict(zip(STEP_FEATURES, step_vector([a, b], 2, window=5), strict=True))
    assert early["prefix_distance"] == 0.0 and early["agreement"] == 1.0


def test_admission_has_no_step_features():
    assert step_vector([_member("ab")], 0, window=5) == [0.0] * len(STEP_FEATURES)


def test_prompt_vector():
    v = prompt_vector(0.25, "heldout_unseen", 3, {"b": 2.0, "a": 1.0}, ["a", "b", "c"])
    assert v == [0.25, 1.0, pytest.approx(math.log(4)), 1.0, 2.0, 0.0]
    assert prompt_vector(0.5, "train", 0, {}, [])[1] == 0.0


def test_the_coded_distance_is_the_prefix_gates():
    table: dict[str, str] = {}
    groups = [["go 1", "go 2", "<END>"], ["go 1", "look"], ["go 2"]]
    members = []
    for actions in groups:
        m = MemberSteps(table)
        for s, a in enumerate(actions):
            m.add(StepEvent(group_id=0, rollout_index=0, step_index=s, action=a, done=False, reward=0.0, policy_version=0))
        members.append(m)
    for k in (1, 2, 3, 5):
        f = dict(zip(STEP_FEATURES, step_vector(members, k, window=5), strict=True))
        assert f["prefix_distance"] == pytest.approx(mean_prefix_edit_distance(groups, k))
