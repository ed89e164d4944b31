"""all_of / any_of: the combined statistic, and cuts only when the members agree (or any one fires)."""

import pytest

from gates import GATES
from gates.combined import AllOfGate, AnyOfGate, combine
from pipeline.messages import StepEvent

MEMBERS = [{"name": "prefix_edit_distance", "tau": 0.5}, {"name": "stall", "tau": 0.5, "window": 2}]


def _stream(actions: list[list[str]], flags: list[str]) -> list[StepEvent]:
    """Lockstep events; flags per member per step: 'p' progress, 'i' inadmissible."""
    return [StepEvent(group_id=1, rollout_index=r, step_index=s, action=actions[r][s], done=False, reward=0.0,
                      policy_version=0, admissible=flags[r][s] == "p")
            for s in range(len(actions[0])) for r in range(len(actions))]


def _decisions(gate, events):
    gate.open(1, 2)
    out = [d for e in events if (d := gate.observe(e)) is not None]
    gate.close(1)
    return out


SAME = [["look"] * 4, ["look"] * 4]  # d_K = 0
DIFFERENT = [["a", "b", "c", "d"], ["e", "f", "g", "h"]]  # d_K = 1


def test_combine_is_max_or_min_of_value_over_tau():
    assert combine([0.2, 0.6], [0.4, 0.3], "all") == pytest.approx(2.0)
    assert combine([0.2, 0.6], [0.4, 0.3], "any") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="mode"):
        combine([0.1], [0.1], "most")


def test_all_of_cuts_only_when_every_member_is_below_its_tau():
    stuck, moving = ["iiii", "iiii"], ["pppp", "pppp"]
    assert [d.cut for d in _decisions(AllOfGate(AllOfGate.Options(k=4, gates=MEMBERS)), _stream(SAME, stuck))] == [True]
    assert [d.cut for d in _decisions(AllOfGate(AllOfGate.Options(k=4, gates=MEMBERS)), _stream(SAME, moving))] == [False]
    assert [d.cut for d in _decisions(AllOfGate(AllOfGate.Options(k=4, gates=MEMBERS)), _stream(DIFFERENT, stuck))] == [False]


def test_any_of_cuts_when_one_member_is_below_its_tau():
    assert [d.cut for d in _decisions(AnyOfGate(AnyOfGate.Options(k=4, gates=MEMBERS)), _stream(DIFFERENT, ["iiii", "iiii"]))] == [True]
    assert [d.cut for d in _decisions(AnyOfGate(AnyOfGate.Options(k=4, gates=MEMBERS)), _stream(DIFFERENT, ["pppp", "pppp"]))] == [False]


def test_members_see_every_checkpoint_and_the_first_agreeing_one_cuts():
    # Stuck only from step 2 on: at K=2 the stall member says progress (1.0), at K=4 it says 0.
    gate = AllOfGate(AllOfGate.Options(k=2, checkpoints=[4], gates=MEMBERS))
    decisions = _decisions(gate, _stream(SAME, ["ppii", "ppii"]))
    assert [(d.checkpoint, d.cut) for d in decisions] == [(2, False), (4, True)]
    assert "prefix_edit_distance=0.000/0.5" in decisions[1].reason


def test_bad_member_specs_are_refused():
    with pytest.raises(ValueError, match="at least two"):
        AllOfGate(AllOfGate.Options(k=4, gates=MEMBERS[:1]))
    with pytest.raises(ValueError, match="name and a tau"):
        AllOfGate(AllOfGate.Options(k=4, gates=[{"name": "stall"}, MEMBERS[0]]))
    with pytest.raises(ValueError, match="tau must be > 0"):
        AllOfGate(AllOfGate.Options(k=4, gates=[{"name": "stall", "tau": 0}, MEMBERS[0]]))
    with pytest.raises(LookupError, match="unknown gates"):
        AllOfGate(AllOfGate.Options(k=4, gates=[{"name": "nope", "tau": 0.1}, MEMBERS[0]]))


def test_combinations_are_registered():
    assert GATES.get("all_of") is AllOfGate and GATES.get("any_of") is AnyOfGate
