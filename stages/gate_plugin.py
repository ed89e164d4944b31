"""The gate stage as a `[[stages]]` plugin (`target = "gate"`): its options and the factory that builds it.

The runtime builds its own gate stage from `[gate]`; `STAGES["gate"]` builds one from a `[[stages]]`
options table. Like every plugin it takes a strict `Options` Struct (`pipeline.plugins`); k / tau /
checkpoints left unset are the named gate's own defaults.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .gate_stage import GateStage


class GateStageOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    gate: str
    """The gate: a registered name (`gates.GATES`) or `module:Class`."""
    options: dict[str, Any] = {}
    """The gate's own options (its `Options` Struct)."""
    k: int | None = None
    tau: float | None = None
    checkpoints: list[int] | None = None
    """Shorthands for options.k / options.tau / options.checkpoints (None: the gate's default)."""
    shadow: bool = False
    """Send decisions flagged shadow (nothing is cancelled) and score them."""


def gate_stage(options: GateStageOptions) -> GateStage:
    return GateStage(
        gate=options.gate, k=options.k, tau=options.tau, checkpoints=options.checkpoints, shadow=options.shadow,
        options=options.options,
    )


gate_stage.Options = GateStageOptions  # type: ignore[attr-defined]  # the plugin convention's `Options`
