"""World generation: room layouts (numbered receptacles) and tasks (objects placed in a layout plus a goal).

Both are pure functions of a `random.Random`, which callers seed with strings
(`random.Random("household:0:layout:kitchen:7")`): string seeds go through SHA-512, so the worlds are
identical on every machine and Python version and do not depend on hash randomization.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from .catalog import (
    APPLIANCE_OF_FAMILY,
    FAMILIES,
    MAX_INSTANCE_NUMBER,
    RECEPTACLE_KINDS,
    ROOM_KINDS,
    TEMPLATES,
    accepts,
    can_transform,
)

LOOK_TARGET = "desklamp"
"""The target kind recorded in a look_at_obj_in_light combination (its goal is the lamp, not a receptacle)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """A room: its kind and its numbered receptacles, sorted by kind then number."""

    layout_id: str
    room: str
    kinds: tuple[str, ...]
    """Receptacle kind per receptacle index."""
    names: tuple[str, ...]
    """Receptacle name per index ("cabinet 3")."""
    lamp_at: int
    """Index of the receptacle the desklamp stands on; -1 when the room has no lamp."""

    @property
    def signature(self) -> tuple:
        """What makes two layouts the same room (the id is only a label)."""
        return (self.room, self.kinds, self.lamp_at)


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """Everything needed to replay a task: the layout, where each object starts, and the goal."""

    layout: Layout
    family: str
    goal_kind: str
    """Object kind the goal is about ("mug")."""
    target: int
    """Receptacle index the objects must end up in; -1 for look_at_obj_in_light."""
    objects: tuple[tuple[str, int], ...]
    """(object name, receptacle index) for every takeable object, sorted by receptacle then name."""
    description: str

    @property
    def signature(self) -> tuple:
        """Identity of the task's initial state and goal (the wording of the description is not part)."""
        return (self.layout.signature, self.family, self.goal_kind, self.target, self.objects)

    @property
    def combination(self) -> tuple[str, str, str]:
        """(family, object kind, target kind): what heldout_unseen keeps apart from training."""
        target_kind = LOOK_TARGET if self.target < 0 else self.layout.kinds[self.target]
        return (self.family, self.goal_kind, target_kind)

    @property
    def goal_count(self) -> int:
        return 2 if self.family == "pick_two_obj_and_place" else 1


@dataclass(frozen=True, slots=True)
class WorldState:
    """What changes during an episode of a `TaskSpec`: the engine's state as plain tuples (`HouseholdEnv.world()`)."""

    loc: int
    """Receptacle index the agent stands at; -1 = the middle of the room."""
    held: int
    """Object index held; -1 = none."""
    names: tuple[str, ...]
    """Object names by object index (the desklamp, if any, included)."""
    contents: tuple[tuple[int, ...], ...]
    """Object indices per receptacle."""
    is_open: tuple[bool, ...]
    states: tuple[int, ...]
    """CLEAN | HOT | COOL flags per object."""
    lamp_lit: bool
    visited: tuple[bool, ...] = ()
    """Per receptacle: the agent has stood at it (what stands on top of it, a lamp say, was in view)."""
    looked: tuple[bool, ...] = ()
    """Per receptacle: the agent has seen inside it (arrived while it was open or open-view, or opened it).
    Only the agent moves objects, so what the agent knows is the current contents of these."""


def generate_layout(room: str, layout_id: str, rng: random.Random) -> Layout:
    """Draw receptacle counts within the room kind's bounds and, if the room has one, a lamp's place."""
    room_kind = ROOM_KINDS[room]
    kinds: list[str] = []
    names: list[str] = []
    for kind, fewest, most in room_kind.receptacles:
        for number in range(1, rng.randint(fewest, most) + 1):
            kinds.append(kind)
            names.append(f"{kind} {number}")
    lamp_at = -1
    if room_kind.lamp_on:
        lamp_at = rng.choice([i for i, kind in enumerate(kinds) if kind in room_kind.lamp_on])
    return Layout(layout_id, room, tuple(kinds), tuple(names), lamp_at)


def combinations_in(layout: Layout) -> list[tuple[str, str, str]]:
    """Every (family, object kind, target kind) a task in this layout can have, in a fixed order."""
    room_kind = ROOM_KINDS[layout.room]
    present = sorted(set(layout.kinds))
    combos = []
    for family in room_kind.families:
        appliance = APPLIANCE_OF_FAMILY.get(family)
        for obj in room_kind.objects:
            if not can_transform(family, obj):
                continue
            sources = [kind for kind in present if accepts(kind, obj)]
            if family == "look_at_obj_in_light":
                if sources:
                    combos.append((family, obj, LOOK_TARGET))
                continue
            for target in sources:
                # The object must be able to start somewhere other than the target kind's receptacles.
                if target != appliance and any(kind != target for kind in sources):
                    combos.append((family, obj, target))
    return combos


def all_combinations() -> list[tuple[str, str, str]]:
    """Every combination any layout of any room kind could have (upper bound, fixed order)."""
    combos: set[tuple[str, str, str]] = set()
    for room, room_kind in ROOM_KINDS.items():
        full = Layout("full", room, tuple(kind for kind, _, _ in room_kind.receptacles), (), -1)
        combos.update(combinations_in(full))
    return sorted(combos, key=lambda combo: (FAMILIES.index(combo[0]), combo[1], combo[2]))


@lru_cache(maxsize=65536)
def places_for(layout: Layout, obj: str) -> tuple[int, ...]:
    """Receptacle indices of `layout` where an object of kind `obj` may be placed."""
    return tuple(i for i, kind in enumerate(layout.kinds) if accepts(kind, obj))


def _number_instances(kinds: Sequence[str], rng: random.Random) -> list[str]:
    """Name objects "mug 2": each kind's instances get distinct numbers drawn from 1..MAX_INSTANCE_NUMBER."""
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    pools = {kind: rng.sample(range(1, MAX_INSTANCE_NUMBER + 1), count) for kind, count in counts.items()}
    return [f"{kind} {pools[kind].pop()}" for kind in kinds]


def generate_task(layout: Layout, combo: tuple[str, str, str], rng: random.Random) -> TaskSpec:
    """Place the goal objects (never already in the target) and distractors, and word the goal.

    Raises ValueError when `combo` is impossible in `layout` (callers draw combos from `combinations_in`).
    """
    family, goal_kind, target_kind = combo
    room_kind = ROOM_KINDS[layout.room]
    if family == "look_at_obj_in_light":
        target = -1
    else:
        candidates = [i for i, kind in enumerate(layout.kinds) if kind == target_kind]
        if not candidates:
            raise ValueError(f"layout {layout.layout_id} has no {target_kind} for {combo}")
        target = rng.choice(candidates)
    goal_sources = [i for i in places_for(layout, goal_kind) if i != target]
    if not goal_sources:
        raise ValueError(f"layout {layout.layout_id} has nowhere to put a {goal_kind} for {combo}")

    needed = 2 if family == "pick_two_obj_and_place" else 1
    goal_instances = needed + (rng.random() < 0.3)
    kinds = [goal_kind] * goal_instances
    places = [rng.choice(goal_sources) for _ in kinds]

    others = [obj for obj in room_kind.objects if obj != goal_kind]
    n_receptacles = len(layout.kinds)
    for _ in range(rng.randint(1, max(2, (n_receptacles * 3) // 4))):
        obj = rng.choice(others)
        places_for_obj = places_for(layout, obj)
        if places_for_obj and kinds.count(obj) < MAX_INSTANCE_NUMBER:
            kinds.append(obj)
            places.append(rng.choice(places_for_obj))

    names = _number_instances(kinds, rng)
    objects = tuple(sorted(zip(names, places, strict=True), key=lambda item: (item[1], item[0])))
    template = rng.choice(TEMPLATES[family])
    description = template.format(
        obj=goal_kind,
        prep=RECEPTACLE_KINDS[target_kind].preposition if target >= 0 else "",
        target=layout.names[target] if target >= 0 else "",
    )
    return TaskSpec(layout, family, goal_kind, target, objects, description)
