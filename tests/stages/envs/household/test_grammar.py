import pytest

from stages.envs.household.grammar import Command, format_command, parse_command

CANONICAL = [
    ("look", Command("look")),
    ("inventory", Command("inventory")),
    ("go to cabinet 3", Command("go", "cabinet 3")),
    ("open fridge 1", Command("open", "fridge 1")),
    ("close drawer 2", Command("close", "drawer 2")),
    ("examine mug 1", Command("examine", "mug 1")),
    ("use desklamp 1", Command("use", "desklamp 1")),
    ("take mug 1 from countertop 2", Command("take", "mug 1", "countertop 2")),
    ("put mug 1 in cabinet 3", Command("put", "mug 1", "cabinet 3", "in")),
    ("put mug 1 on countertop 1", Command("put", "mug 1", "countertop 1", "on")),
    ("clean mug 1 with sinkbasin 1", Command("clean", "mug 1", "sinkbasin 1")),
    ("heat egg 2 with microwave 1", Command("heat", "egg 2", "microwave 1")),
    ("cool apple 1 with fridge 1", Command("cool", "apple 1", "fridge 1")),
]


@pytest.mark.parametrize(("text", "command"), CANONICAL)
def test_every_form_parses_and_formats_back(text, command):
    assert parse_command(text) == command
    assert format_command(command) == text


def test_parsing_forgives_case_spacing_and_a_final_period():
    assert parse_command("  Go   To Cabinet 3. ") == Command("go", "cabinet 3")
    assert parse_command("TAKE mug 1 FROM countertop 2") == Command("take", "mug 1", "countertop 2")


@pytest.mark.parametrize(
    "text",
    ["", "dance", "go cabinet 3", "go to cabinet", "take mug from cabinet 1", "put mug 1 into cabinet 3",
     "clean mug 1 in sinkbasin 1", "open", "look around", "take mug 1 to countertop 2", "heat egg 2 using microwave 1"],
)
def test_text_outside_the_grammar_is_rejected(text):
    assert parse_command(text) is None
