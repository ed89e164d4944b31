"""Every sentence the household environment can say, the tokenization rule, and the vocabulary.

Tokenization expectation (what `vocabulary()` is complete for): lowercase or not, then separate the
punctuation marks `.` `,` `:` into tokens of their own, then split on whitespace. `tokenize` does exactly
that. Texts use ALFWorld's sentence-initial capitals ("You arrive at cabinet 3."); the vocabulary lists
every word both as it appears and lowercased, so a tokenizer that lowercases and one that does not both
see no unknown word. Only the three punctuation marks above ever appear; there are no apostrophes,
hyphens or digits other than the instance numbers 1..9 ("mug 1"), which are separate words.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .catalog import LAMP, MAX_INSTANCE_NUMBER, OBJECT_KINDS, RECEPTACLE_KINDS, ROOM_KINDS, TEMPLATES

# Messages. `{...}` fields are filled with receptacle/object names, room names or lists of them.
INTRO = "You are in the middle of the {room}. Looking quickly around you, you see {receptacles}."
TASK = "Your task is to: {description}."
ARRIVE = "You arrive at {rec}. "
CLOSED = "The {rec} is closed."
OPEN_CONTENTS = "The {rec} is open. In it, you see {things}."
SURFACE_CONTENTS = "On the {rec}, you see {things}."
BASIN_CONTENTS = "In the {rec}, you see {things}."
OPENED = "You open the {rec}. The {rec} is open. In it, you see {things}."
CLOSED_IT = "You close the {rec}."
TAKEN = "You pick up the {obj} from the {rec}."
PUT = "You put the {obj} {prep} the {rec}."
CLEANED = "You clean the {obj} using the {rec}."
HEATED = "You heat the {obj} using the {rec}."
COOLED = "You cool the {obj} using the {rec}."
LAMP_ON = "You turn on the {obj}."
LAMP_OFF = "You turn off the {obj}."
EXAMINE_OBJECT = "This is a {state} {obj}."
CARRYING = "You are carrying: a {obj}."
CARRYING_NOTHING = "You are not carrying anything."
FACING = "You are facing the {rec}. Looking quickly around you, you see {receptacles}."
NOTHING_HAPPENS = "Nothing happens."
NOTHING = "nothing"
STATES = ("normal", "clean", "hot", "cool", "and")
"""Words `EXAMINE_OBJECT` may use for `{state}` ("hot and clean")."""

MESSAGES = (
    INTRO, TASK, ARRIVE, CLOSED, OPEN_CONTENTS, SURFACE_CONTENTS, BASIN_CONTENTS, OPENED, CLOSED_IT,
    TAKEN, PUT, CLEANED, HEATED, COOLED, LAMP_ON, LAMP_OFF, EXAMINE_OBJECT, CARRYING, CARRYING_NOTHING,
    FACING, NOTHING_HAPPENS,
)

COMMAND_WORDS = (
    "go", "to", "open", "close", "take", "from", "put", "in", "on", "clean", "heat", "cool", "with", "use",
    "examine", "inventory", "look",
)
"""Every fixed word of the command grammar (see `grammar.py`)."""

PUNCTUATION = (".", ",", ":")
_SEPARATE_PUNCTUATION = str.maketrans({mark: f" {mark} " for mark in PUNCTUATION})


def tokenize(text: str) -> list[str]:
    """Lowercase, separate `.` `,` `:` into their own tokens, split on whitespace."""
    return text.lower().translate(_SEPARATE_PUNCTUATION).split()


def listing(names: Sequence[str]) -> str:
    """ALFWorld's enumeration: "a mug 1", "a mug 1, and a knife 2", "a mug 1, a cup 2, and a pan 1"."""
    if not names:
        return NOTHING
    if len(names) == 1:
        return f"a {names[0]}"
    return ", ".join(f"a {name}" for name in names[:-1]) + f", and a {names[-1]}"


def _words(text: str) -> list[str]:
    """Words of a message with its `{fields}` removed, case preserved."""
    return re.sub(r"\{[a-z]+\}", " ", text).translate(_SEPARATE_PUNCTUATION).split()


def vocabulary() -> list[str]:
    """Every token household texts can contain: as written and lowercased, sorted."""
    words: set[str] = set(PUNCTUATION) | set(COMMAND_WORDS) | set(STATES) | {"a", NOTHING, LAMP}
    for message in MESSAGES:
        words.update(_words(message))
    for templates in TEMPLATES.values():
        for template in templates:
            words.update(_words(template))
    for room in ROOM_KINDS:
        words.update(room.split())
    words.update(RECEPTACLE_KINDS)
    words.update(kind.preposition for kind in RECEPTACLE_KINDS.values())
    words.update(OBJECT_KINDS)
    words.update(str(number) for number in range(1, MAX_INSTANCE_NUMBER + 1))
    return sorted(words | {word.lower() for word in words})
