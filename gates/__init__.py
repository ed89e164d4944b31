"""Decisions about where compute goes: in-flight gates, allocators (pre-rollout), post-rollout filters.

`GATES` is the in-flight gate registry; a gate class is constructed as `Gate(k=..., tau=...,
checkpoints=..., **gate.options)` and has the `open / observe / close` shape of `PrefixEditDistanceGate`.
"""

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
    },
)

__all__ = [
    "END",
    "GATES",
    "Gate",
    "GateDecision",
    "PrefixEditDistanceGate",
    "ShadowLedger",
    "decide",
    "mean_prefix_edit_distance",
]
