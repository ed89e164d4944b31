"""Streaming allocators: who gets rollout slots (pre-rollout) and which groups train (post-rollout).

`build_allocator(name, options, ctx)` makes one from the config's `[allocator]` section; `check_allocator`
lists every problem with such a section without building anything (config validation). `name` is a
registered allocator (`ALLOCATORS`, extended by the `rollcut.allocators` entry-point group) or `module:Class`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.plugins import build_plugin, option_problems
from pipeline.registry import Registry

from .base import Admission as Admission
from .base import Allocator as Allocator
from .base import AllocatorBase as AllocatorBase
from .base import AllocatorContext as AllocatorContext
from .base import Ledger as Ledger
from .base import TaskCycle as TaskCycle

ALLOCATORS = Registry(
    "allocators",
    {
        "uniform": "gates.allocators.uniform:UniformAllocator",
        "dapo": "gates.allocators.dapo:DapoAllocator",
        "greso": "gates.allocators.greso:GresoAllocator",
        "pilot_commit": "gates.allocators.pilot_commit:PilotCommitAllocator",
        "vip": "gates.allocators.vip:VipAllocator",
        "aero": "gates.allocators.aero:AeroAllocator",
        "family": "gates.allocators.family:FamilyAllocator",
    },
)


def check_allocator(name: str, options: Mapping[str, Any]) -> list[str]:
    """Every problem with `[allocator] name = ...` and its `[allocator.options]` table, as readable lines
    (empty when fine): an unknown allocator, each unknown or mistyped or out-of-range option, then (only if
    each option is fine alone) a combination the allocator rejects (`pipeline.plugins.option_problems`)."""
    try:
        cls = ALLOCATORS.get(name)
    except LookupError as exc:
        return [f"allocator.name: {exc}"]
    return option_problems(cls, options, "allocator.options", f"allocator {name!r}")


def build_allocator(name: str, options: Mapping[str, Any], ctx: AllocatorContext) -> Allocator:
    """Resolve `name`, decode `options` strictly into its `Options` struct and construct it as
    `Class(options, ctx)` (the plugin convention of `pipeline.plugins`).

    Raises:
        ValueError: an unknown allocator, invalid options (every problem listed), or options the
            allocator cannot honour in this context (e.g. group sizes against G).
    """
    problems = check_allocator(name, options)
    if problems:
        raise ValueError(f"invalid allocator {name!r}:\n" + "\n".join(f"  - {p}" for p in problems))
    return build_plugin(ALLOCATORS.get(name), options, "allocator.options", f"allocator {name!r}", ctx)


__all__ = [
    "ALLOCATORS",
    "Admission",
    "Allocator",
    "AllocatorBase",
    "AllocatorContext",
    "Ledger",
    "TaskCycle",
    "build_allocator",
    "check_allocator",
]
