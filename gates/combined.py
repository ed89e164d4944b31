"""Combinations of threshold gates: cut only when every member gate (all_of) or any (any_of) would.

Each member is a registered threshold gate with its own tau, e.g. in TOML

    [gate]
    name = "all_of"
    k = 10
    checkpoints = [15, 20]
    tau = 1.0
    [gate.options]
    gates = [{name = "prefix_edit_distance", tau = 0.6}, {name = "stall", tau = 0.35, window = 5}]

Every member sees the same checkpoints (the combination's `k` and `checkpoints`) and is built with
tau = 0, so it never cuts on its own and reports every checkpoint. At a checkpoint that all members have
evaluated, the combined value is max (all_of) or min (any_of) of value_i / tau_i, and the group is cut iff
that value < `tau` (1.0: each member at its own threshold; a smaller tau tightens them all together).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pipeline.messages import RolloutFailed, StepEvent

from .base import Checkpoint, Gate, Threshold
from .prefix import GateDecision


def combine(values: Sequence[float], taus: Sequence[float], mode: str) -> float:
    """The combined statistic of member values [M] with member thresholds [M]: max or min of value / tau."""
    if mode not in ("all", "any"):
        raise ValueError(f"mode must be 'all' or 'any', got {mode!r}")
    ratios = [v / t if t > 0 else float("inf") for v, t in zip(values, taus, strict=True)]
    return max(ratios) if mode == "all" else min(ratios)


class AllOfGate:
    """Cut iff every member gate is below its own tau at the same checkpoint (see module docstring)."""

    name = "all_of"
    mode = "all"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        k: Checkpoint = 12
        """The first checkpoint K, every member's."""
        tau: Threshold = 1.0
        """Cut iff the combined value (max or min of value_i / tau_i) < tau."""
        checkpoints: list[Checkpoint] = []
        """Extra checkpoints, every member's."""
        gates: list[dict[str, Any]] = []
        """The members: each a table with the gate's `name`, its own `tau` (> 0) and its other options."""

    def __init__(self, options: Options) -> None:
        from . import build_gate  # the registry imports this module

        if len(options.gates) < 2:
            raise ValueError(f"{self.name} gate: options.gates needs at least two member gates, got {len(options.gates)}")
        self.options = options
        self.tau = options.tau
        self.members: list[Gate] = []
        self.taus: list[float] = []
        for spec in options.gates:
            spec = dict(spec)
            if "name" not in spec or "tau" not in spec:
                raise ValueError(f"{self.name} gate: each member needs a name and a tau, got {spec}")
            if "k" in spec or "checkpoints" in spec:
                raise ValueError(f"{self.name} gate: a member's checkpoints are the combination's (k, checkpoints), got {spec}")
            name, member_tau = spec.pop("name"), float(spec.pop("tau"))
            if member_tau <= 0:
                raise ValueError(f"{self.name} gate: member {name} tau must be > 0, got {member_tau}")
            member_options = spec | {"k": options.k, "tau": 0.0, "checkpoints": list(options.checkpoints)}
            self.members.append(build_gate(name, member_options))
            self.taus.append(member_tau)
        self._pending: dict[int, dict[int, dict[int, float]]] = {}
        """group -> checkpoint -> member index -> value, until every member has evaluated it."""
        self._done: set[int] = set()
        self._decisions: dict[int, list[GateDecision]] = {}

    @property
    def open_groups(self) -> int:
        return len(self._pending)

    def open(self, group_id: int, size: int) -> None:
        for member in self.members:
            member.open(group_id, size)
        self._pending[group_id] = {}
        self._decisions[group_id] = []

    def close(self, group_id: int) -> list[GateDecision]:
        for member in self.members:
            member.close(group_id)
        self._pending.pop(group_id, None)
        self._done.discard(group_id)
        return self._decisions.pop(group_id, [])

    def observe(self, event: StepEvent | RolloutFailed) -> GateDecision | None:
        gid = event.group_id
        pending = self._pending.get(gid)
        if pending is None or gid in self._done:
            return None
        for i, member in enumerate(self.members):
            decision = member.observe(event)
            if decision is not None:
                pending.setdefault(decision.checkpoint, {})[i] = decision.value
        latest = None
        for k in sorted(pending):
            if len(pending[k]) < len(self.members):
                break
            by_member = pending.pop(k)
            values = [by_member[i] for i in range(len(self.members))]
            value = combine(values, self.taus, self.mode)
            cut = value < self.tau
            parts = ", ".join(f"{m.name}={v:.3f}/{t}" for m, v, t in zip(self.members, values, self.taus, strict=True))
            latest = GateDecision(cut, value, k, f"{self.name}({parts}) at K={k}: {value:.3f} {'<' if cut else '>='} {self.tau}")
            self._decisions[gid].append(latest)
            if cut:
                self._done.add(gid)
                break
        return latest


class AnyOfGate(AllOfGate):
    """Cut iff some member gate is below its own tau at a checkpoint (see module docstring)."""

    name = "any_of"
    mode = "any"
