"""What the gate stage accepts from the step stream: only messages consistent with what it already knows.

The step socket may receive frames from anyone who can reach it (see `pipeline.transport`). A frame that
decodes is still checked against the groups the stage has seen opened:

* `GroupOpened`: a non-negative id not open already, a size in [1, MAX_GROUP_SIZE], and at most
  `max_open` groups open at once (forged opens cannot grow memory without bound);
* `StepEvent`: an open group, `0 <= rollout_index < size`, a rollout that has not ended, and
  `step_index` equal to the number of steps already seen for that rollout (no duplicate, no gap);
* `RolloutFailed`: an open group, an index in range, a rollout that has not ended;
* `GroupClosed`: an open group with one reward (and one `complete` flag, if any) per rollout.

Anything else is dropped and counted with its reason. A second `GroupOpened` for an open group means two
senders disagree about it: the group is *poisoned* (its gate state is forgotten and it is never cut) until
it closes. Forged frames can thus only keep a group from being cut (plain GRPO for it), never force a cut,
unless they are well-formed, in order and ahead of the real ones; only authenticating the peers (ZeroMQ
CURVE) rules that out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.messages import GroupClosed, GroupOpened, RolloutFailed, StepEvent

MAX_GROUP_SIZE = 4096


@dataclass(slots=True)
class _Open:
    size: int
    steps: list[int]
    """Steps seen per rollout; -1 once the rollout ended (done or failed)."""
    poisoned: bool = False


@dataclass
class StepValidator:
    max_open: int = 4096
    _groups: dict[int, _Open] = field(default_factory=dict)

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    def check(self, message: object) -> str | None:
        """None if `message` is consistent (and record it), else the reason to drop it."""
        match message:
            case GroupOpened():
                return self._open(message)
            case StepEvent() | RolloutFailed():
                return self._step(message)
            case GroupClosed():
                return self._close(message)
        return "unexpected_message"

    def _open(self, message: GroupOpened) -> str | None:
        if message.group_id < 0:
            return "bad_group_id"
        if not 1 <= message.size <= MAX_GROUP_SIZE:
            return "bad_group_size"
        known = self._groups.get(message.group_id)
        if known is not None:
            known.poisoned = True
            return "duplicate_group"
        if len(self._groups) >= self.max_open:
            return "too_many_open_groups"
        self._groups[message.group_id] = _Open(message.size, [0] * message.size)
        return None

    def _step(self, message: StepEvent | RolloutFailed) -> str | None:
        group = self._groups.get(message.group_id)
        if group is None:
            return "unknown_group"
        if group.poisoned:
            return "poisoned_group"
        r = message.rollout_index
        if not 0 <= r < group.size:
            return "rollout_index_out_of_range"
        seen = group.steps[r]
        if seen < 0:
            return "after_rollout_end"
        if isinstance(message, RolloutFailed):
            group.steps[r] = -1
            return None
        if message.step_index != seen:
            return "duplicate_step" if 0 <= message.step_index < seen else "step_out_of_order"
        group.steps[r] = -1 if message.done else seen + 1
        return None

    def _close(self, message: GroupClosed) -> str | None:
        group = self._groups.get(message.group_id)
        if group is None:
            return "unknown_group"
        if len(message.rewards) != group.size:
            return "bad_rewards"
        if message.complete and len(message.complete) != group.size:
            return "bad_complete"
        del self._groups[message.group_id]
        return None

    def poisoned(self, group_id: int) -> bool:
        group = self._groups.get(group_id)
        return group is not None and group.poisoned
