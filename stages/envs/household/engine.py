"""The household engine: one episode of a `TaskSpec`, ALFWorld-style texts and admissible commands.

Rules (ALFWorld's): the agent starts in the middle of the room and can `go to` any receptacle. Openable
receptacles (cabinets, drawers, fridge, microwave, safe) start closed: their contents are hidden and can
be neither taken nor added to until opened. The agent carries at most one object. `clean`, `heat` and
`cool` need the held object and the agent at a sinkbasin, microwave or fridge (which need not be open).
`use desklamp 1` toggles the lamp at the agent's receptacle. A command that is not admissible now gives
"Nothing happens." and still counts as a step. Winning gives reward 1 and ends the episode; reaching
`max_steps` ends it with reward 0.

Speed: everything that depends only on the layout (receptacle strings, `go to` lists, the room
description) is built once per layout and cached; a step parses the command, changes a few lists and
builds the admissible list from precomputed strings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from ..base import Observation, StepResult, Task
from . import text as T
from .catalog import LAMP, RECEPTACLE_KINDS, ROOM_KINDS
from .grammar import Command, parse_command
from .world import Layout, TaskSpec, WorldState

CLEAN, HOT, COOL = 1, 2, 4
REQUIRED_STATE = {"pick_clean_then_place": CLEAN, "pick_heat_then_place": HOT, "pick_cool_then_place": COOL}
_TRANSFORM = {"sinkbasin": ("clean", CLEAN, T.CLEANED), "microwave": ("heat", HOT, T.HEATED),
              "fridge": ("cool", COOL, T.COOLED)}
_LAMP_NAME = f"{LAMP} 1"


@dataclass(frozen=True, slots=True)
class _LayoutStrings:
    """Everything about a layout that never changes during an episode, as ready-made strings."""

    index: dict[str, int]
    preposition: tuple[str, ...]
    openable: tuple[bool, ...]
    basin: tuple[bool, ...]
    """Non-openable `in` receptacles (sinkbasin, garbagecan...): "In the sinkbasin 1, you see ..."."""
    transform: tuple[tuple[str, int, str] | None, ...]
    go_to: tuple[str, ...]
    go_to_except: tuple[tuple[str, ...], ...]
    """`go to` commands for every receptacle but the one at each index; the last entry is for the middle."""
    open_cmd: tuple[str, ...]
    close_cmd: tuple[str, ...]
    examine_cmd: tuple[str, ...]
    arrive: tuple[str, ...]
    closed: tuple[str, ...]
    intro: str
    around: str


@lru_cache(maxsize=4096)
def _layout_strings(layout: Layout) -> _LayoutStrings:
    names = layout.names
    go_to = tuple(f"go to {name}" for name in names)
    kinds = [RECEPTACLE_KINDS[kind] for kind in layout.kinds]
    around = T.listing(names)
    return _LayoutStrings(
        index={name: i for i, name in enumerate(names)},
        preposition=tuple(kind.preposition for kind in kinds),
        openable=tuple(kind.openable for kind in kinds),
        basin=tuple(kind.preposition == "in" and not kind.openable for kind in kinds),
        transform=tuple(_TRANSFORM.get(kind) for kind in layout.kinds),
        go_to=go_to,
        go_to_except=tuple(go_to[:i] + go_to[i + 1 :] for i in range(len(names))) + (go_to,),
        open_cmd=tuple(f"open {name}" for name in names),
        close_cmd=tuple(f"close {name}" for name in names),
        examine_cmd=tuple(f"examine {name}" for name in names),
        arrive=tuple(T.ARRIVE.format(rec=name) for name in names),
        closed=tuple(T.CLOSED.format(rec=name) for name in names),
        intro=T.INTRO.format(room=ROOM_KINDS[layout.room].name, receptacles=around),
        around=around,
    )


class HouseholdEnv:
    """An `Environment` over household tasks; `resolve` maps a Task to its TaskSpec (the suite's lookup)."""

    def __init__(self, resolve: Callable[[Task], TaskSpec] | None, max_steps: int = 30) -> None:
        self._resolve = resolve
        self.max_steps = max_steps
        self._spec: TaskSpec | None = None
        self._done = True

    # -- episode -------------------------------------------------------------------------------------

    def reset(self, task: Task) -> Observation:
        if self._resolve is None:
            raise RuntimeError("this env was built without a task lookup; use reset_spec()")
        return self.reset_spec(self._resolve(task))

    def reset_spec(self, spec: TaskSpec) -> Observation:
        """Start an episode of `spec` directly (what `reset` does after looking the task up)."""
        layout = spec.layout
        s = self._s = _layout_strings(layout)
        self._spec = spec
        names = [name for name, _ in spec.objects]
        kinds = [name.split(" ", 1)[0] for name in names]
        contents: list[list[int]] = [[] for _ in layout.names]
        for obj, (_, place) in enumerate(spec.objects):
            contents[place].append(obj)
        self._lamp = -1
        if layout.lamp_at >= 0:
            self._lamp = len(names)
            names.append(_LAMP_NAME)
            kinds.append(LAMP)
            contents[layout.lamp_at].insert(0, self._lamp)
        self._names, self._kinds, self._contents = names, kinds, contents
        self._obj_index = {name: i for i, name in enumerate(names)}
        self._state = [0] * len(names)
        self._is_open = [False] * len(layout.names)
        self._visited = [False] * len(layout.names)
        self._looked = [False] * len(layout.names)
        self._loc = -1
        self._held = -1
        self._lamp_lit = False
        self._steps = 0
        self._done = False
        self._goal_state = REQUIRED_STATE.get(spec.family, 0)
        self._commands: dict[tuple[str, int, int], str] = {}
        text = f"{s.intro}\n\n{T.TASK.format(description=spec.description)}"
        return Observation(text, self._admissible())

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("the episode is over; call reset() first")
        command = parse_command(action)
        feedback = self._apply(command) if command is not None else None
        valid = feedback is not None
        if not valid:
            feedback = T.NOTHING_HAPPENS
        self._steps += 1
        won = valid and self._won()
        truncated = not won and self._steps >= self.max_steps
        self._done = won or truncated
        admissible = () if self._done else self._admissible()
        info = {"valid": valid, "steps": self._steps, "truncated": truncated}
        return StepResult(Observation(feedback, admissible), 1.0 if won else 0.0, self._done, won, info)

    def world(self) -> WorldState:
        """A snapshot of the episode's state (what `recovery.next_command` plans from)."""
        return WorldState(
            loc=self._loc,
            held=self._held,
            names=tuple(self._names),
            contents=tuple(tuple(objs) for objs in self._contents),
            is_open=tuple(self._is_open),
            states=tuple(self._state),
            lamp_lit=self._lamp_lit,
            visited=tuple(self._visited),
            looked=tuple(self._looked),
        )

    @property
    def spec(self) -> TaskSpec | None:
        """The task of the current episode (None before the first reset and after close)."""
        return self._spec

    def close(self) -> None:
        self._spec = None
        self._done = True

    # -- rules ---------------------------------------------------------------------------------------

    def _visible(self, rec: int) -> bool:
        return self._is_open[rec] or not self._s.openable[rec]

    def _go(self, name: str) -> str | None:
        """Walk to receptacle `name`; what is on or in it shows if it is open-view or open."""
        s = self._s
        rec = s.index.get(name, -1)
        if rec < 0 or rec == self._loc:
            return None
        self._loc = rec
        self._visited[rec] = True
        self._looked[rec] = self._looked[rec] or self._visible(rec)
        return s.arrive[rec] + self._view(rec)

    def _open_or_close(self, opening: bool, here: str) -> str | None:
        """Open or close the receptacle the agent stands at (`here`); opening shows its inside."""
        loc = self._loc
        if not self._s.openable[loc] or self._is_open[loc] == opening:
            return None
        self._is_open[loc] = opening
        if not opening:
            return T.CLOSED_IT.format(rec=here)
        self._looked[loc] = True
        return T.OPENED.format(rec=here, things=self._things(loc))

    def _apply(self, command: Command) -> str | None:
        """Carry out `command` if it is possible now and return its feedback; None if it is not."""
        verb, first, second, preposition = command
        s = self._s
        loc = self._loc
        if verb == "go":
            return self._go(first)
        if verb == "look":
            if loc < 0:
                return s.intro
            return T.FACING.format(rec=self._spec.layout.names[loc], receptacles=s.around)
        if verb == "inventory":
            return T.CARRYING.format(obj=self._names[self._held]) if self._held >= 0 else T.CARRYING_NOTHING
        if loc < 0:
            return None
        here = self._spec.layout.names[loc]
        if verb in ("open", "close"):
            return self._open_or_close(verb == "open", first) if first == here else None
        if verb == "examine":
            if first == here:
                return self._view(loc)
            held = self._held
            if held < 0 or first != self._names[held]:
                return None
            return T.EXAMINE_OBJECT.format(state=_describe_state(self._state[held]), obj=first)
        if verb == "use":
            if first != _LAMP_NAME or self._lamp not in self._contents[loc] or not self._visible(loc):
                return None
            self._lamp_lit = not self._lamp_lit
            return (T.LAMP_ON if self._lamp_lit else T.LAMP_OFF).format(obj=first)
        if second != here:
            return None
        obj = self._obj_index.get(first, -1)
        if obj < 0:
            return None
        if verb == "take":
            if self._held >= 0 or obj == self._lamp or not self._visible(loc) or obj not in self._contents[loc]:
                return None
            self._contents[loc].remove(obj)
            self._held = obj
            return T.TAKEN.format(obj=first, rec=here)
        if obj != self._held:
            return None
        if verb == "put":
            if preposition != s.preposition[loc] or not self._visible(loc):
                return None
            self._contents[loc].append(obj)
            self._held = -1
            return T.PUT.format(obj=first, prep=preposition, rec=here)
        transform = s.transform[loc]
        if transform is None or transform[0] != verb:
            return None
        _, flag, message = transform
        state = self._state[obj]
        # Heating undoes cooling and vice versa; cleaning keeps the temperature.
        self._state[obj] = (state & ~(HOT | COOL)) | flag if flag != CLEAN else state | CLEAN
        return message.format(obj=first, rec=here)

    def _things(self, rec: int) -> str:
        names = self._names
        return T.listing([names[obj] for obj in self._contents[rec]])

    def _view(self, rec: int) -> str:
        s = self._s
        name = self._spec.layout.names[rec]
        if s.openable[rec]:
            if not self._is_open[rec]:
                return s.closed[rec]
            return T.OPEN_CONTENTS.format(rec=name, things=self._things(rec))
        template = T.BASIN_CONTENTS if s.basin[rec] else T.SURFACE_CONTENTS
        return template.format(rec=name, things=self._things(rec))

    def _won(self) -> bool:
        spec = self._spec
        goal = spec.goal_kind
        if spec.target < 0:
            held = self._held
            return (
                held >= 0 and self._kinds[held] == goal and self._lamp_lit
                and self._loc == spec.layout.lamp_at
            )
        if self._loc != spec.target:
            return False
        needed, required, kinds, state = spec.goal_count, self._goal_state, self._kinds, self._state
        done = sum(1 for obj in self._contents[spec.target] if kinds[obj] == goal and state[obj] & required == required)
        return done >= needed

    def _command(self, form: str, obj: int, rec: int) -> str:
        """A cached object command string ("take mug 1 from countertop 2")."""
        key = (form, obj, rec)
        cached = self._commands.get(key)
        if cached is None:
            cached = self._commands[key] = form.format(obj=self._names[obj], rec=self._spec.layout.names[rec])
        return cached

    def _admissible(self) -> tuple[str, ...]:
        s = self._s
        loc = self._loc
        commands = list(s.go_to_except[loc])
        if loc >= 0:
            visible = True
            if s.openable[loc]:
                visible = self._is_open[loc]
                commands.append(s.close_cmd[loc] if visible else s.open_cmd[loc])
            held = self._held
            if visible:
                contents = self._contents[loc]
                if held < 0:
                    lamp = self._lamp
                    commands.extend(self._command("take {obj} from {rec}", obj, loc) for obj in contents if obj != lamp)
                else:
                    form = "put {obj} in {rec}" if s.preposition[loc] == "in" else "put {obj} on {rec}"
                    commands.append(self._command(form, held, loc))
                if self._lamp >= 0 and self._lamp in contents:
                    commands.append("use " + _LAMP_NAME)
            if held >= 0:
                transform = s.transform[loc]
                if transform is not None:
                    commands.append(self._command(transform[0] + " {obj} with {rec}", held, loc))
                commands.append("examine " + self._names[held])
            commands.append(s.examine_cmd[loc])
        commands.append("inventory")
        commands.append("look")
        return tuple(commands)


def _describe_state(state: int) -> str:
    words = [word for flag, word in ((HOT, "hot"), (COOL, "cool"), (CLEAN, "clean")) if state & flag]
    return " and ".join(words) if words else "normal"
