"""The recovering expert: the omniscient expert's next command from *any* state of an episode.

`expert.plan` is a plan from the initial state; imitation learning that visits states the expert never
would (DAgger, noise-injected demonstrations) needs a label for every state it reaches, including after
a wrong turn: a detour, a wrong object taken, an object put in the wrong place, a heated object that
must be cooled. `next_command(spec, world)` is that label, a pure function of the task and a `WorldState`
snapshot (`HouseholdEnv.world()`):

1. goal done but not standing at the target -> go to the target (winning needs the agent there);
2. holding a goal object: not yet in the required state -> go to the family's appliance and transform
   it; else go to the target, open it if closed, put it there (look_at_obj_in_light: go to the lamp,
   switch it on);
3. holding anything else -> put it back where the agent stands (opening it first if closed);
4. hands empty -> take the cheapest goal object still needed: here first, then open receptacles, then
   ones behind a door, then receptacle order (the omniscient plan's order); go, open if closed, take.

Followed from any reachable state it wins within a few steps of the omniscient plan's length (tested on
random detours).

`searching=True` labels only with what the agent could know (`WorldState.looked` / `visited`): a goal
object is fetched only from a receptacle the agent has seen inside; otherwise the label is the next
receptacle of the searching expert's canonical order (`expert.search_order`) not yet seen inside (go
there, open it), and the desklamp is sought on the unvisited surfaces of `expert.lamp_order`. Once every
receptacle of the order has been seen, the omniscient rule decides (an object the agent moved is always
somewhere it has seen). These labels are predictable from an agent's observations, which the omniscient
ones are not where the goal object is still hidden.
"""

from __future__ import annotations

from .catalog import APPLIANCE_OF_FAMILY, LAMP, RECEPTACLE_KINDS
from .engine import REQUIRED_STATE
from .expert import lamp_order, search_order
from .world import TaskSpec, WorldState

_VERB_OF_FAMILY = {"pick_clean_then_place": "clean", "pick_heat_then_place": "heat", "pick_cool_then_place": "cool"}


def _kind(name: str) -> str:
    return name.split(" ", 1)[0]


def next_command(spec: TaskSpec, world: WorldState, *, searching: bool = False) -> str:
    """The recovering expert's next command from `world` (see the module docstring for the rules)."""
    names = spec.layout.names
    held = world.held
    goal = spec.goal_kind
    required = REQUIRED_STATE.get(spec.family, 0)
    if spec.target < 0:  # look_at_obj_in_light: hold a goal object at the lamp, lamp on
        if held >= 0 and _kind(world.names[held]) == goal:
            lamp_at = spec.layout.lamp_at
            if world.loc == lamp_at:
                return f"use {LAMP} 1"
            if searching and not world.visited[lamp_at]:  # lamp_order holds lamp_at: one is unvisited
                lamp_at = next(rec for rec in lamp_order(spec) if not world.visited[rec])
            return f"go to {names[lamp_at]}"
        if held >= 0:
            return _put_back(spec, world)
        return _fetch(spec, world, exclude=(), searching=searching)
    placed = [
        obj for obj in world.contents[spec.target]
        if _kind(world.names[obj]) == goal and world.states[obj] & required == required
    ]
    if len(placed) >= spec.goal_count:
        return f"go to {names[spec.target]}"
    if held < 0:
        return _fetch(spec, world, exclude=placed, searching=searching)
    if _kind(world.names[held]) != goal:
        return _put_back(spec, world)
    if world.states[held] & required != required:
        appliance = spec.layout.kinds.index(APPLIANCE_OF_FAMILY[spec.family])
        if world.loc != appliance:
            return f"go to {names[appliance]}"
        return f"{_VERB_OF_FAMILY[spec.family]} {world.names[held]} with {names[appliance]}"
    return _reach(spec, world, spec.target) or (
        f"put {world.names[held]} {RECEPTACLE_KINDS[spec.layout.kinds[spec.target]].preposition} "
        f"{names[spec.target]}"
    )


def _reach(spec: TaskSpec, world: WorldState, rec: int) -> str | None:
    """The command that brings `rec`'s inside within reach (go there, open it), or None if it is."""
    if world.loc != rec:
        return f"go to {spec.layout.names[rec]}"
    if RECEPTACLE_KINDS[spec.layout.kinds[rec]].openable and not world.is_open[rec]:
        return f"open {spec.layout.names[rec]}"
    return None


def _put_back(spec: TaskSpec, world: WorldState) -> str:
    """Put the held non-goal object down where the agent stands (one is always somewhere by then)."""
    here = world.loc
    name = spec.layout.names[here]
    preposition = RECEPTACLE_KINDS[spec.layout.kinds[here]].preposition
    return _reach(spec, world, here) or f"put {world.names[world.held]} {preposition} {name}"


def _fetch(spec: TaskSpec, world: WorldState, *, exclude: tuple[int, ...] | list[int], searching: bool = False) -> str:
    """Go to, open and take the cheapest goal object not in `exclude` (here first, then the plan's order);
    `searching`: among those in receptacles seen inside, else look into the next unseen one of the order."""
    kinds = spec.layout.kinds

    def cost(item: tuple[int, int]) -> tuple:
        obj, rec = item
        hidden = RECEPTACLE_KINDS[kinds[rec]].openable and not world.is_open[rec]
        return (rec != world.loc, hidden, rec, world.names[obj])

    candidates = [
        (obj, rec)
        for rec, objs in enumerate(world.contents)
        for obj in objs
        if _kind(world.names[obj]) == spec.goal_kind and obj not in exclude
    ]
    if searching:
        known = [(obj, rec) for obj, rec in candidates if world.looked[rec]]
        unseen = [rec for rec in search_order(spec) if not world.looked[rec]]
        if not known and unseen:
            command = _reach(spec, world, unseen[0])
            assert command is not None, "a receptacle in reach (here, open) has been seen inside"
            return command
        candidates = known or candidates
    obj, rec = min(candidates, key=cost)
    return _reach(spec, world, rec) or f"take {world.names[obj]} from {spec.layout.names[rec]}"
