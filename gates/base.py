"""The in-flight gate contract: it watches a group's step stream and may decide to cut it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pipeline.messages import RolloutFailed, StepEvent

if TYPE_CHECKING:
    from pipeline.contracts import GateDecision


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
