"""build_allocator / check_allocator: the registry lists every built-in and bad configs read clearly."""

from __future__ import annotations

import pytest

from gates.allocators import ALLOCATORS, Allocator, AllocatorContext, build_allocator, check_allocator

from .sim import make_tasks

BUILTINS = ["aero", "dapo", "family", "greso", "pilot_commit", "uniform", "vip"]
CTX = AllocatorContext(tasks=make_tasks(12), group_size=8, batch_groups=4, seed=0)


def test_registry_lists_every_builtin() -> None:
    assert set(BUILTINS) <= set(ALLOCATORS.names())


@pytest.mark.parametrize("name", BUILTINS)
def test_builds_with_defaults(name: str) -> None:
    allocator = build_allocator(name, {}, CTX)
    assert isinstance(allocator, Allocator)
    assert allocator.name == name
    assert check_allocator(name, {}) == []


def test_module_class_path_needs_no_registration() -> None:
    allocator = build_allocator("gates.allocators.greso:GresoAllocator", {"p_easy": 0.3}, CTX)
    assert allocator.name == "greso"


def test_unknown_allocator() -> None:
    problems = check_allocator("nope", {})
    assert len(problems) == 1
    assert problems[0].startswith("allocator.name:")
    assert "greso" in problems[0]  # the known names are listed
    with pytest.raises(ValueError, match="nope"):
        build_allocator("nope", {}, CTX)


def test_every_bad_option_is_reported_at_once() -> None:
    problems = check_allocator("greso", {"p_easy": 2.0, "stepp": 0.1, "safety": "high"})
    assert len(problems) == 3
    assert problems[0] == "allocator.options.p_easy: Expected `float` <= 1.0"
    assert "allocator.options.stepp: unknown option for allocator 'greso'" in problems[1]
    assert "known:" in problems[1]
    assert "step" in problems[1]
    assert problems[2] == "allocator.options.safety: Expected `float`, got `str`"


def test_cross_field_problem_is_reported() -> None:
    assert check_allocator("pilot_commit", {"p_lo": 0.9}) == [
        "allocator.options: empty band: p_lo (0.9) > 1 - p_up (0.75)"
    ]
    assert check_allocator("greso", {"min_p": 0.9, "max_p": 0.5}) == [
        "allocator.options: min_p (0.9) must be <= max_p (0.5)"
    ]


def test_build_raises_value_error_listing_problems() -> None:
    with pytest.raises(ValueError, match=r"allocator.options.k: Expected `float` >= 0"):
        build_allocator("aero", {"k": -1}, CTX)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("pilot_commit", {"n_pilot": 4, "n_effective": 6}, "n_effective"),
        ("vip", {"min_rollouts": 1}, "min_rollouts must be >= 2"),
        ("vip", {"estimator": "dr_grpo", "min_rollouts": 2}, "min_rollouts must be >= 3"),
        ("vip", {"budget_per_prompt": 40}, "budget_per_prompt"),
        ("aero", {"n_explore": 8, "n_total": 4}, "n_total"),
    ],
)
def test_options_checked_against_the_context(name: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_allocator(name, options, CTX)


def test_no_tasks_is_an_error() -> None:
    empty = AllocatorContext(tasks=[], group_size=8, batch_groups=4, seed=0)
    with pytest.raises(ValueError, match="no tasks"):
        build_allocator("dapo", {}, empty)
