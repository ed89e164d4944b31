"""Gates are plugins like any other: `build_gate` decodes the options table strictly into the gate's
`Options` (whose defaults are the only ones), `check_gate` lists every problem at once."""

from gates import build_gate, check_gate
from gates.prefix import PrefixEditDistanceGate
from gates.stall import StallGate


def test_each_gate_has_its_own_one_default():
    prefix, stall = build_gate("prefix_edit_distance", {}), build_gate("stall", {})
    assert isinstance(prefix, PrefixEditDistanceGate) and (prefix.checkpoints, prefix.tau) == ([12], 0.5)
    assert isinstance(stall, StallGate) and (stall.checkpoints, stall.tau, stall.window) == ([8, 12, 16, 20], 0.9, 5)


def test_options_override_the_defaults():
    gate = build_gate("stall", {"k": 4, "checkpoints": [8, 4], "tau": 0.9, "window": 2})
    assert (gate.checkpoints, gate.tau, gate.window) == ([4, 8], 0.9, 2)


def test_every_bad_option_is_listed():
    assert check_gate("stall", {"k": 0, "windo": 3, "checkpoints": [2, -1]}) == [
        "gate.options.k: Expected `int` >= 1",
        "gate.options.windo: unknown option for gate 'stall' (known: checkpoints, k, tau, window)",
        "gate.options.checkpoints: Expected `int` >= 1 - at `$[1]`",
    ]
    assert check_gate("nope", {})[0].startswith("gate.name: unknown gates 'nope'")
