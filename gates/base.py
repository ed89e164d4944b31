"""The in-flight gate contract: it watches a group's step stream and may decide to cut it.

A gate is constructed as `Gate(options)` from its own strict `Options` Struct (the plugin convention of
`pipeline.plugins`); a threshold gate's options hold its checkpoint `k`, extra `checkpoints` and
threshold `tau`, each with the gate's one default (the `[gate]` keys k / tau / checkpoints of a config
only override them: `gates.gate_options`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Protocol, runtime_checkable

import msgspec

from pipeline.messages import GroupOpened, RolloutFailed, StepEvent

if TYPE_CHECKING:
    from pipeline.contracts import GateDecision


Checkpoint = Annotated[int, msgspec.Meta(ge=1)]
"""A step count K at which a gate evaluates a group (>= 1)."""
Threshold = Annotated[float, msgspec.Meta(ge=0)]
"""A gate's tau (>= 0)."""


@runtime_checkable
class Gate(Protocol):
    name: str

    def open(self, group_id: int, size: int) -> None:
        """A group of `size` rollouts started."""
        ...

    def observe(self, event: StepEvent | RolloutFailed) -> GateDecision | None:
        """One step of one rollout (or its failure); returns a decision when the gate evaluated."""
        ...

    def close(self, group_id: int) -> list[GateDecision]:
        """The group ended; forget it and return the decisions taken for it."""
        ...


@runtime_checkable
class LearningGate(Gate, Protocol):
    """A gate that learns from the stream's outcomes (`gates.zero_variance`). The gate stage calls these
    besides the `Gate` contract: `opened` before `open`, `labelled` when a group's outcome settles (never for
    a cut group), runs `serve` in its nursery, and adds `report` to its statistics."""

    def opened(self, message: GroupOpened) -> None:
        """The prompt side of a group about to open."""
        ...

    def labelled(self, group_id: int, rewards: Sequence[float]) -> None:
        """The group's settled complete-trajectory rewards (its prompt's merged group)."""
        ...

    async def serve(self) -> None:
        """Background work (refits) until cancelled; must never block the event loop."""
        ...

    def report(self) -> Mapping[str, float | None]:
        """Flat `gate/...` figures for the statistics and the run's metrics."""
        ...


@runtime_checkable
class ResumableLearningGate(LearningGate, Protocol):
    """A learning gate whose learned state survives a resume (optional: the gate stage checks for these two and
    keeps it in the run's checkpoint, `GateStage.counters_state`; without them a resumed run starts it afresh)."""

    def state_dict(self) -> dict[str, Any]:
        """What it learned, as plain data (str keys, lists, numbers): no object a checkpoint would have to unpickle."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Put back what `state_dict` gave (a resumed run's, before any group opens)."""
        ...
