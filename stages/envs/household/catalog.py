"""The household catalogue: room kinds, receptacle kinds, object kinds and the six ALFWorld task families.

Everything here is static data; world generation (`world.py`) draws from it and the vocabulary
(`text.py`) is derived from it, so a new object or receptacle kind added here is automatically
generated, described, planned for and tokenized.

Names are single lowercase words (ALFWorld style: `spraybottle`, `sinkbasin`) so that "mug 1" or
"cabinet 3" is always exactly two tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = (
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj_and_place",
)
"""The six ALFWorld task families; a family's index in this tuple is its `family_index` feature."""

APPLIANCE_OF_FAMILY = {
    "pick_clean_then_place": "sinkbasin",
    "pick_heat_then_place": "microwave",
    "pick_cool_then_place": "fridge",
}
"""The receptacle kind a transform family needs (the agent must go there holding the object)."""

LAMP = "desklamp"
"""The lamp of `look_at_obj_in_light`: a fixed (not takeable) object standing on a surface."""

MAX_INSTANCE_NUMBER = 9
"""Receptacle and object numbers run from 1 to this (it bounds the vocabulary's numerals)."""


@dataclass(frozen=True, slots=True)
class ReceptacleKind:
    name: str
    preposition: str
    """`in` or `on`: how objects are put there and how its contents are described."""
    openable: bool = False
    """Openable receptacles start closed; their contents are hidden and untouchable until opened."""
    accepts: frozenset[str] | None = None
    """Object categories that may be placed here; None means every category."""


@dataclass(frozen=True, slots=True)
class ObjectKind:
    name: str
    category: str
    cleanable: bool = False
    heatable: bool = False
    coolable: bool = False


def _receptacles(*specs: tuple) -> dict[str, ReceptacleKind]:
    return {spec[0]: ReceptacleKind(*spec) for spec in specs}


_FOOD = frozenset({"food"})
_KITCHENWARE = frozenset({"food", "dish", "utensil", "cookware", "bottle"})
_SMALL = frozenset({"food", "dish", "utensil", "cookware", "bottle", "toiletry", "gadget", "stationery", "decor"})

RECEPTACLE_KINDS = _receptacles(
    ("countertop", "on"),
    ("cabinet", "in", True, _SMALL),
    ("drawer", "in", True, frozenset({"utensil", "toiletry", "gadget", "stationery"})),
    ("fridge", "in", True, frozenset({"food", "dish", "bottle"})),
    ("microwave", "in", True, frozenset({"food", "dish"})),
    ("sinkbasin", "in", False, frozenset({"food", "dish", "utensil", "cookware", "toiletry"})),
    ("stoveburner", "on", False, frozenset({"cookware"})),
    ("diningtable", "on", False, _KITCHENWARE | frozenset({"gadget", "stationery", "decor"})),
    ("shelf", "on", False, _SMALL),
    ("coffeemachine", "on", False, frozenset({"dish"})),
    ("garbagecan", "in", False, frozenset({"food", "bottle", "toiletry", "stationery"})),
    ("toilet", "on", False, frozenset({"toiletry"})),
    ("bathtubbasin", "in", False, frozenset({"toiletry"})),
    ("towelholder", "on", False, frozenset({"linen"})),
    ("bed", "on", False, frozenset({"gadget", "stationery", "linen"})),
    ("desk", "on", False, _SMALL - _FOOD),
    ("sidetable", "on", False, _SMALL - _FOOD),
    ("dresser", "on", False, frozenset({"gadget", "stationery", "decor", "dish"})),
    ("safe", "in", True, frozenset({"gadget", "stationery"})),
    ("laundryhamper", "in", False, frozenset({"linen"})),
    ("sofa", "on", False, frozenset({"gadget", "stationery", "linen"})),
    ("armchair", "on", False, frozenset({"gadget", "stationery", "linen"})),
    ("coffeetable", "on", False, _SMALL - _FOOD),
    ("tvstand", "on", False, frozenset({"gadget", "decor"})),
)

OBJECT_KINDS = {
    kind.name: kind
    for kind in (
        # food
        ObjectKind("apple", "food", cleanable=True, heatable=True, coolable=True),
        ObjectKind("egg", "food", heatable=True, coolable=True),
        ObjectKind("potato", "food", cleanable=True, heatable=True, coolable=True),
        ObjectKind("tomato", "food", cleanable=True, heatable=True, coolable=True),
        ObjectKind("lettuce", "food", cleanable=True, coolable=True),
        ObjectKind("bread", "food", heatable=True, coolable=True),
        # dishes
        ObjectKind("mug", "dish", cleanable=True, heatable=True, coolable=True),
        ObjectKind("cup", "dish", cleanable=True, heatable=True, coolable=True),
        ObjectKind("bowl", "dish", cleanable=True, heatable=True, coolable=True),
        ObjectKind("plate", "dish", cleanable=True, heatable=True, coolable=True),
        # utensils and cookware
        ObjectKind("knife", "utensil", cleanable=True),
        ObjectKind("butterknife", "utensil", cleanable=True),
        ObjectKind("fork", "utensil", cleanable=True),
        ObjectKind("spoon", "utensil", cleanable=True),
        ObjectKind("spatula", "utensil", cleanable=True),
        ObjectKind("ladle", "utensil", cleanable=True),
        ObjectKind("pan", "cookware", cleanable=True, coolable=True),
        ObjectKind("pot", "cookware", cleanable=True, coolable=True),
        ObjectKind("kettle", "cookware", cleanable=True),
        # bottles
        ObjectKind("winebottle", "bottle", coolable=True),
        ObjectKind("saltshaker", "bottle"),
        ObjectKind("peppershaker", "bottle"),
        # bathroom
        ObjectKind("soapbar", "toiletry", cleanable=True),
        ObjectKind("soapbottle", "toiletry"),
        ObjectKind("spraybottle", "toiletry"),
        ObjectKind("toiletpaper", "toiletry"),
        ObjectKind("dishsponge", "toiletry", cleanable=True),
        ObjectKind("cloth", "linen", cleanable=True),
        ObjectKind("handtowel", "linen"),
        ObjectKind("candle", "decor"),
        # bedroom and living room
        ObjectKind("alarmclock", "gadget"),
        ObjectKind("cellphone", "gadget"),
        ObjectKind("laptop", "gadget"),
        ObjectKind("remotecontrol", "gadget"),
        ObjectKind("keychain", "gadget"),
        ObjectKind("watch", "gadget"),
        ObjectKind("cd", "stationery"),
        ObjectKind("book", "stationery"),
        ObjectKind("pen", "stationery"),
        ObjectKind("pencil", "stationery"),
        ObjectKind("creditcard", "stationery"),
        ObjectKind("newspaper", "stationery"),
        ObjectKind("pillow", "linen"),
        ObjectKind("statue", "decor"),
        ObjectKind("vase", "decor"),
        ObjectKind("box", "decor"),
    )
}


@dataclass(frozen=True, slots=True)
class RoomKind:
    name: str
    """As it appears in text ("living room" is two words)."""
    receptacles: tuple[tuple[str, int, int], ...]
    """(receptacle kind, fewest, most) per kind that may appear; most is at most MAX_INSTANCE_NUMBER."""
    objects: tuple[str, ...]
    """Object kinds that may appear in this room."""
    families: tuple[str, ...]
    """Task families this room supports (it has the receptacles and objects they need)."""
    lamp_on: tuple[str, ...] = ()
    """Surfaces the desklamp may stand on; empty when the room has no lamp."""


ROOM_KINDS = {
    room.name: room
    for room in (
        RoomKind(
            "kitchen",
            (
                ("cabinet", 2, 9), ("coffeemachine", 0, 1), ("countertop", 1, 3), ("diningtable", 0, 1),
                ("drawer", 1, 6), ("fridge", 1, 1), ("garbagecan", 0, 1), ("microwave", 1, 1),
                ("shelf", 0, 3), ("sinkbasin", 1, 1), ("stoveburner", 1, 4),
            ),
            (
                "apple", "egg", "potato", "tomato", "lettuce", "bread", "mug", "cup", "bowl", "plate",
                "knife", "butterknife", "fork", "spoon", "spatula", "ladle", "pan", "pot", "kettle",
                "winebottle", "saltshaker", "peppershaker", "dishsponge", "soapbottle",
            ),
            ("pick_and_place", "pick_clean_then_place", "pick_heat_then_place", "pick_cool_then_place",
             "pick_two_obj_and_place"),
        ),
        RoomKind(
            "bathroom",
            (
                ("bathtubbasin", 0, 1), ("cabinet", 1, 4), ("countertop", 1, 1), ("drawer", 0, 4),
                ("garbagecan", 0, 1), ("shelf", 0, 2), ("sinkbasin", 1, 2), ("toilet", 1, 1),
                ("towelholder", 0, 2),
            ),
            ("soapbar", "soapbottle", "spraybottle", "toiletpaper", "dishsponge", "cloth", "handtowel",
             "candle"),
            ("pick_and_place", "pick_clean_then_place", "pick_two_obj_and_place"),
        ),
        RoomKind(
            "bedroom",
            (
                ("bed", 1, 1), ("desk", 0, 1), ("drawer", 1, 6), ("dresser", 0, 1), ("garbagecan", 0, 1),
                ("laundryhamper", 0, 1), ("safe", 0, 1), ("shelf", 0, 4), ("sidetable", 1, 2),
            ),
            ("alarmclock", "cellphone", "laptop", "keychain", "watch", "cd", "book", "pen", "pencil",
             "creditcard", "pillow", "mug", "bowl", "statue"),
            ("pick_and_place", "look_at_obj_in_light", "pick_two_obj_and_place"),
            lamp_on=("desk", "sidetable", "dresser"),
        ),
        RoomKind(
            "living room",
            (
                ("armchair", 0, 2), ("cabinet", 0, 4), ("coffeetable", 1, 1), ("diningtable", 0, 1),
                ("drawer", 0, 4), ("garbagecan", 0, 1), ("shelf", 0, 4), ("sidetable", 1, 2),
                ("sofa", 1, 1), ("tvstand", 0, 1),
            ),
            ("remotecontrol", "keychain", "creditcard", "laptop", "newspaper", "book", "pillow", "watch",
             "statue", "vase", "box", "cellphone", "candle"),
            ("pick_and_place", "look_at_obj_in_light", "pick_two_obj_and_place"),
            lamp_on=("sidetable", "coffeetable"),
        ),
    )
}

ROOM_ORDER = tuple(ROOM_KINDS)
"""Room kinds in a fixed order; a room's index here is its `room_index` feature."""


def accepts(receptacle: str, obj: str) -> bool:
    """May an object of kind `obj` be placed on/in a receptacle of kind `receptacle`?"""
    allowed = RECEPTACLE_KINDS[receptacle].accepts
    return allowed is None or OBJECT_KINDS[obj].category in allowed


def can_transform(family: str, obj: str) -> bool:
    """Can `family`'s transformation (clean/heat/cool) be applied to an object of kind `obj`?"""
    kind = OBJECT_KINDS[obj]
    return {
        "pick_clean_then_place": kind.cleanable,
        "pick_heat_then_place": kind.heatable,
        "pick_cool_then_place": kind.coolable,
    }.get(family, True)


TEMPLATES = {
    "pick_and_place": ("put a {obj} {prep} {target}", "put some {obj} {prep} {target}"),
    "look_at_obj_in_light": ("look at {obj} under the desklamp", "examine the {obj} with the desklamp"),
    "pick_clean_then_place": ("put a clean {obj} {prep} {target}", "clean some {obj} and put it {prep} {target}"),
    "pick_heat_then_place": ("put a hot {obj} {prep} {target}", "heat some {obj} and put it {prep} {target}"),
    "pick_cool_then_place": ("put a cool {obj} {prep} {target}", "cool some {obj} and put it {prep} {target}"),
    "pick_two_obj_and_place": ("put two {obj} {prep} {target}", "find two {obj} and put them {prep} {target}"),
}
"""ALFWorld-style task texts per family (without the final period); the generator picks one."""
