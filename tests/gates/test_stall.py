"""The stall gate: s_K over hand-built step streams, checkpoint timing, and its decision rule."""

import pytest

from gates import GATES, build_gate
from gates.stall import StallGate, progress_fraction
from pipeline.messages import RolloutFailed, StepEvent


def _step(r: int, s: int, *, ok: bool = True, new: bool = True, done: bool = False, reward: float = 0.0, gid: int = 1):
    return StepEvent(group_id=gid, rollout_index=r, step_index=s, action=f"a{s}", done=done, reward=reward,
                     policy_version=0, admissible=ok, new_observation=new)


def _member(r: int, flags: str, *, done_at: int | None = None, reward: float = 0.0) -> list[StepEvent]:
    """flags: one char per step, 'p' progress, 'i' inadmissible, 'r' repeated observation."""
    return [_step(r, s, ok=c != "i", new=c != "r", done=s == done_at, reward=reward if s == done_at else 0.0)
            for s, c in enumerate(flags)]


def test_progress_fraction_counts_the_last_window_steps_of_running_members():
    steps = [_member(0, "pppiir"), _member(1, "pppppp")]  # last 3: 'iir' -> 0 of 3, 'ppp' -> 3 of 3
    assert progress_fraction(steps, 6, 3) == pytest.approx(3 / 6)
    assert progress_fraction(steps, 3, 3) == 1.0  # only the first 3 steps count at K=3
    assert progress_fraction(steps, 6, 10) == pytest.approx(9 / 12)


def test_a_member_with_reward_means_never_cut():
    steps = [_member(0, "iii"), _member(1, "pp", done_at=1, reward=1.0)]
    assert progress_fraction(steps, 3, 3) == 1.0


def test_a_member_that_won_after_k_means_never_cut_at_k():
    # Member 0 ran ahead and won at step 5; member 1 only now reaches K=3. The group is known to be mixed.
    steps = [_member(0, "iiiiip", done_at=5, reward=1.0), _member(1, "iii")]
    assert progress_fraction(steps, 3, 3) == 1.0


def test_gate_keeps_a_group_whose_fast_member_already_won():
    gate = StallGate(StallGate.Options(k=3, tau=0.5, window=3))
    gate.open(1, 2)
    fast, slow = _member(0, "iiiiip", done_at=5, reward=1.0), _member(1, "iii")
    decisions = [d for e in [*fast, *slow] if (d := gate.observe(e)) is not None]  # the fast member first
    assert [(d.checkpoint, d.value, d.cut) for d in decisions] == [(3, 1.0, False)]


def test_members_that_ended_without_reward_have_no_say():
    steps = [_member(0, "iii"), _member(1, "pp", done_at=1)]
    assert progress_fraction(steps, 3, 3) == 0.0
    assert progress_fraction([_member(0, "pp", done_at=1)], 3, 3) == 1.0  # nobody running: no evidence


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window"):
        progress_fraction([], 3, 0)
    with pytest.raises(ValueError, match=r"gate.options.window: Expected `int` >= 1"):
        build_gate("stall", {"k": 5, "tau": 0.3, "window": 0})


def _feed(gate, members: list[list[StepEvent]]):
    """Lockstep: step s of every member before step s + 1; returns (event index, decision) of each decision."""
    out, i = [], 0
    for s in range(max(map(len, members))):
        for m in members:
            if s < len(m):
                d = gate.observe(m[s])
                if d is not None:
                    out.append((i, d))
                i += 1
    return out


def test_gate_decides_when_the_last_member_reaches_k_and_cuts_below_tau():
    gate = StallGate(StallGate.Options(k=4, tau=0.5, window=2))
    gate.open(1, 2)
    decisions = _feed(gate, [_member(0, "ppii" + "p" * 4), _member(1, "pprr" + "p" * 4)])
    assert [(i, d.checkpoint, d.value, d.cut) for i, d in decisions] == [(7, 4, 0.0, True)]
    assert "s_4=0.000 < tau=0.5" in decisions[0][1].reason
    assert gate.close(1) == [decisions[0][1]]
    assert gate.open_groups == 0


def test_gate_keeps_a_progressing_group_and_tries_later_checkpoints():
    gate = StallGate(StallGate.Options(k=2, tau=0.5, checkpoints=[4], window=2))
    gate.open(1, 2)
    decisions = _feed(gate, [_member(0, "ppii"), _member(1, "pprr")])
    assert [(d.checkpoint, d.cut) for _, d in decisions] == [(2, False), (4, True)]


def test_group_that_ended_before_k_is_never_evaluated_and_failures_release_it():
    gate = StallGate(StallGate.Options(k=5, tau=0.9))
    gate.open(1, 2)
    assert _feed(gate, [_member(0, "iii", done_at=2), _member(1, "ii", done_at=1)]) == []
    gate.open(2, 2)
    for s in range(5):
        assert gate.observe(_step(0, s, ok=False, gid=2)) is None
    decision = gate.observe(RolloutFailed(group_id=2, rollout_index=1, error="boom"))
    assert decision is not None and decision.cut and decision.checkpoint == 5


def test_stall_is_registered():
    assert GATES.get("stall") is StallGate
