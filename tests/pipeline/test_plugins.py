"""The plugin convention: options decode strictly into the plugin's `Options`, every problem is listed at
once, a plugin without `Options` takes none, and the built plugin gets the struct plus the extension
point's own arguments."""

from typing import Annotated

import msgspec
import pytest

from pipeline.plugins import build_plugin, decode_options, option_problems


class Counter:
    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        start: Annotated[int, msgspec.Meta(ge=0)] = 0
        label: str = "n"

        def __post_init__(self) -> None:
            if self.label == "n" and self.start > 100:
                raise ValueError("a large start needs its own label")

    def __init__(self, options: Options, scale: int, *, offset: int = 0) -> None:
        self.options, self.scale, self.offset = options, scale, offset


class Bare:
    def __init__(self, scale: int = 1) -> None:
        self.scale = scale


def test_every_problem_of_a_table_is_listed_with_its_path():
    problems = option_problems(Counter, {"start": -1, "lable": "x", "label": 3}, "thing.options", "thing 'counter'")
    assert problems == [
        "thing.options.start: Expected `int` >= 0",
        "thing.options.lable: unknown option for thing 'counter' (known: label, start)",
        "thing.options.label: Expected `str`, got `int`",
    ]


def test_a_whole_table_check_runs_once_each_key_is_fine():
    assert option_problems(Counter, {"start": 101}, "w", "c") == ["w: a large start needs its own label"]
    assert option_problems(Counter, {"start": 101, "label": "big"}, "w", "c") == []


def test_the_struct_defaults_are_the_only_defaults_and_extra_arguments_pass_through():
    built = build_plugin(Counter, {"label": "x"}, "w", "c", 3, offset=2)
    assert built.options == Counter.Options(start=0, label="x") and (built.scale, built.offset) == (3, 2)


def test_a_plugin_without_options_takes_none():
    assert build_plugin(Bare, {}, "w", "bare", 4).scale == 4
    assert decode_options(Bare, {}, "w", "bare") is None
    assert option_problems(Bare, {"x": 1, "a": 2}, "w", "bare") == ["w: bare takes no options (got a, x)"]


def test_bad_options_raise_one_value_error_naming_every_problem():
    with pytest.raises(ValueError, match="invalid options for c") as info:
        build_plugin(Counter, {"start": -1, "zzz": 0}, "w", "c", 1)
    assert "w.start: Expected `int` >= 0" in str(info.value) and "w.zzz: unknown option" in str(info.value)


def test_options_must_be_a_struct():
    class Odd:
        Options = dict

    assert option_problems(Odd, {}, "w", "odd") == ["w: 'test_options_must_be_a_struct.<locals>.Odd': `Options` must be a msgspec Struct"]
