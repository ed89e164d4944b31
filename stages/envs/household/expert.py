"""The expert: an omniscient planner that knows where every object starts.

`plan(spec)` is a pure function of the task's initial state. It picks the goal instances that are
cheapest to reach (ones in open view before ones behind a door), walks to each, opens what must be opened
(and remembers what it opened), carries the object through the family's appliance and puts it in the
target. Every plan replays through `HouseholdEnv` and wins; the tests check that on every split.
"""

from __future__ import annotations

from .catalog import APPLIANCE_OF_FAMILY, LAMP, RECEPTACLE_KINDS
from .world import TaskSpec

_VERB_OF_FAMILY = {"pick_clean_then_place": "clean", "pick_heat_then_place": "heat", "pick_cool_then_place": "cool"}


class _Walker:
    """Emits commands while tracking the agent's place and which receptacles it has opened."""

    def __init__(self, spec: TaskSpec) -> None:
        self.names = spec.layout.names
        self.openable = [RECEPTACLE_KINDS[kind].openable for kind in spec.layout.kinds]
        self.commands: list[str] = []
        self.at = -1
        self.opened: set[int] = set()

    def go(self, rec: int) -> None:
        if self.at != rec:
            self.commands.append(f"go to {self.names[rec]}")
            self.at = rec

    def reach_into(self, rec: int) -> None:
        self.go(rec)
        if self.openable[rec] and rec not in self.opened:
            self.commands.append(f"open {self.names[rec]}")
            self.opened.add(rec)


def goal_instances(spec: TaskSpec) -> list[tuple[str, int]]:
    """The goal objects the expert will use, cheapest first: (name, starting receptacle)."""
    kinds = spec.layout.kinds
    candidates = [(name, rec) for name, rec in spec.objects if name.split(" ", 1)[0] == spec.goal_kind]
    candidates.sort(key=lambda item: (RECEPTACLE_KINDS[kinds[item[1]]].openable, item[1], item[0]))
    return candidates[: spec.goal_count]


def plan(spec: TaskSpec) -> list[str]:
    """Commands that solve `spec` from its initial state."""
    walker = _Walker(spec)
    layout = spec.layout
    appliance = APPLIANCE_OF_FAMILY.get(spec.family)
    appliance_at = layout.kinds.index(appliance) if appliance else -1
    for name, source in goal_instances(spec):
        walker.reach_into(source)
        walker.commands.append(f"take {name} from {layout.names[source]}")
        if spec.target < 0:
            walker.go(layout.lamp_at)
            walker.commands.append(f"use {LAMP} 1")
            return walker.commands
        if appliance_at >= 0:
            walker.go(appliance_at)
            walker.commands.append(f"{_VERB_OF_FAMILY[spec.family]} {name} with {layout.names[appliance_at]}")
        walker.reach_into(spec.target)
        preposition = RECEPTACLE_KINDS[layout.kinds[spec.target]].preposition
        walker.commands.append(f"put {name} {preposition} {layout.names[spec.target]}")
    return walker.commands

