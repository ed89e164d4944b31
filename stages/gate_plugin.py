"""The gate stage as a `[[stages]]` plugin (`target = "gate"`): its options and the factory that builds it.

The runtime builds its own gate stage from `[gate]`; `STAGES["gate"]` builds one from a `[[stages]]`
options table. Like every plugin it takes a strict `Options` Struct (`pipeline.plugins`): the `[gate]`
section's keys (`GateChoice`: options, k / tau / checkpoints, shadow) and `gate`, the gate's name; k / tau /
checkpoints left unset are the named gate's own defaults.
"""

from __future__ import annotations

from gates import build_gate
from pipeline.config_sections import GateChoice

from .gate_stage import GateStage


class GateStageOptions(GateChoice, kw_only=True):
    gate: str
    """The gate: a registered name (`gates.GATES`) or `module:Class`."""


def plugin_gate_stage(options: GateStageOptions) -> GateStage:
    gate = build_gate(options.gate, options.gate_options())
    return GateStage(gate, shadow=options.shadow)


plugin_gate_stage.Options = GateStageOptions  # type: ignore[attr-defined]  # the plugin convention's `Options`
