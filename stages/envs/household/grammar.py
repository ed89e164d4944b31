"""The command grammar: parse a command string into a verb and the names it mentions.

    look | inventory
    go to R | open R | close R | examine R | examine O | use O
    take O from R | put O in R | put O on R
    clean O with R | heat O with R | cool O with R

R and O are names of two words, a kind and a number ("cabinet 3", "mug 1"). Parsing is forgiving about
case, surrounding and repeated whitespace and a final period; whether the named things exist and the
command is possible now is the engine's business (`engine.py`), not the grammar's.
"""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    verb: str
    """One of VERBS."""
    first: str = ""
    """The first name (the receptacle of go/open/close, the object otherwise)."""
    second: str = ""
    """The receptacle of take/put/clean/heat/cool."""
    preposition: str = ""
    """`in` or `on` for put."""


VERBS = ("look", "inventory", "go", "open", "close", "examine", "use", "take", "put", "clean", "heat", "cool")
_ONE_NAME = frozenset({"open", "close", "examine", "use"})
_TRANSFORMS = frozenset({"clean", "heat", "cool"})


def parse_command(text: str) -> Command | None:
    """The command `text` spells, or None if it is not in the grammar."""
    words = text.lower().strip().rstrip(".").split()
    n = len(words)
    if n == 1 and words[0] in ("look", "inventory"):
        return Command(words[0])
    if n == 3 and words[0] in _ONE_NAME:
        return Command(words[0], f"{words[1]} {words[2]}")
    if n == 4 and words[0] == "go" and words[1] == "to":
        return Command("go", f"{words[2]} {words[3]}")
    if n == 6:
        verb, link = words[0], words[3]
        first, second = f"{words[1]} {words[2]}", f"{words[4]} {words[5]}"
        if verb == "take" and link == "from":
            return Command("take", first, second)
        if verb == "put" and link in ("in", "on"):
            return Command("put", first, second, link)
        if verb in _TRANSFORMS and link == "with":
            return Command(verb, first, second)
    return None


def format_command(command: Command) -> str:
    """The canonical spelling of `command` (inverse of `parse_command` on canonical strings)."""
    verb = command.verb
    if verb in ("look", "inventory"):
        return verb
    if verb == "go":
        return f"go to {command.first}"
    if verb in _ONE_NAME:
        return f"{verb} {command.first}"
    if verb == "take":
        return f"take {command.first} from {command.second}"
    if verb == "put":
        return f"put {command.first} {command.preposition} {command.second}"
    return f"{verb} {command.first} with {command.second}"
