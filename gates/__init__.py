"""Decisions about where compute goes: in-flight gates, allocators (pre-rollout), post-rollout filters.

`GATES` is the in-flight gate registry; a gate class has a strict `Options` Struct, is constructed as
`Gate(options)` (`build_gate`) and has the `open / observe / close` shape of `PrefixEditDistanceGate`.
"""

from collections.abc import Mapping
from typing import Any

from pipeline.config_sections import gate_options as gate_options
from pipeline.plugins import build_plugin, option_problems
from pipeline.registry import Registry

from .base import Gate as Gate
from .prefix import END as END
from .prefix import GateDecision as GateDecision
from .prefix import PrefixEditDistanceGate as PrefixEditDistanceGate
from .prefix import ShadowLedger as ShadowLedger
from .prefix import decide as decide
from .prefix import mean_prefix_edit_distance as mean_prefix_edit_distance

GATES = Registry(
    "gates",
    {
        "prefix_edit_distance": "gates.prefix:PrefixEditDistanceGate",
        "stall": "gates.stall:StallGate",
        "all_of": "gates.combined:AllOfGate",
        "any_of": "gates.combined:AnyOfGate",
        "zero_variance": "gates.zero_variance:ZeroVarianceGate",
    },
)



def check_gate(name: str, options: Mapping[str, Any]) -> list[str]:
    """Every problem of gate `name` with these options (unknown, mistyped, out of range), for `run.py check`."""
    try:
        cls = GATES.get(name)
    except LookupError as exc:
        return [f"gate.name: {exc}"]
    return option_problems(cls, options, "gate.options", f"gate {name!r}")


def build_gate(name: str, options: Mapping[str, Any]) -> Gate:
    """The gate `name` (registered or `module:Class`) built from its options table.

    Raises:
        LookupError: an unknown gate. ValueError: invalid options, every problem listed.
    """
    return build_plugin(GATES.get(name), options, "gate.options", f"gate {name!r}")


__all__ = [
    "END",
    "GATES",
    "Gate",
    "GateDecision",
    "PrefixEditDistanceGate",
    "ShadowLedger",
    "build_gate",
    "check_gate",
    "decide",
    "gate_options",
    "mean_prefix_edit_distance",
]
