"""A user-style gate plugin loaded by `module:Class` in integration tests: cuts every even group at
step 1, so the pipeline's cut / backfill / learner paths are exercised deterministically."""

import msgspec

from gates import GateDecision
from pipeline.messages import RolloutFailed, StepEvent


class CutEvenGroups:
    name = "cut_even_groups"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        at_step: int = 1

    def __init__(self, options: Options) -> None:
        self.at_step = options.at_step
        self._groups: dict[int, list[int]] = {}

    def open(self, group_id: int, size: int) -> None:
        self._groups[group_id] = [0] * size

    def observe(self, event: StepEvent | RolloutFailed) -> GateDecision | None:
        steps = self._groups.get(event.group_id)
        if steps is None or isinstance(event, RolloutFailed) or event.group_id % 2:
            return None
        steps[event.rollout_index] += 1
        if min(steps) == self.at_step:
            self._groups.pop(event.group_id)
            return GateDecision(cut=True, value=0.0, checkpoint=self.at_step, reason="even group")
        return None

    def close(self, group_id: int) -> list[GateDecision]:
        self._groups.pop(group_id, None)
        return []
