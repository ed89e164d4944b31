"""Streaming allocators: who gets rollout slots (pre-rollout) and which groups train (post-rollout).

`build_allocator(name, options, ctx)` makes one from the config's `[allocator]` section; `check_allocator`
lists every problem with such a section without building anything (config validation). `name` is a
registered allocator (`ALLOCATORS`, extended by the `rollcut.allocators` entry-point group) or `module:Class`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from pipeline.registry import Registry

from .base import Admission as Admission
from .base import Allocator as Allocator
from .base import AllocatorContext as AllocatorContext

ALLOCATORS = Registry(
    "allocators",
    {
        "uniform": "gates.allocators.uniform:UniformAllocator",
        "dapo": "gates.allocators.dapo:DapoAllocator",
        "greso": "gates.allocators.greso:GresoAllocator",
        "pilot_commit": "gates.allocators.pilot_commit:PilotCommitAllocator",
        "vip": "gates.allocators.vip:VipAllocator",
        "aero": "gates.allocators.aero:AeroAllocator",
    },
)


def _allocator_class(name: str) -> Any:
    cls = ALLOCATORS.get(name)
    options = getattr(cls, "Options", None)
    if not (isinstance(options, type) and issubclass(options, msgspec.Struct)):
        raise LookupError(f"allocator {name!r} ({ALLOCATORS.target(name)}) has no msgspec Struct `Options`")
    return cls


def check_allocator(name: str, options: Mapping[str, Any]) -> list[str]:
    """Every problem with `[allocator] name = ...` and its `[allocator.options]` table, as readable lines
    (empty when fine): an unknown allocator, each unknown or mistyped or out-of-range option, then (only if
    each option is fine alone) a combination the allocator rejects."""
    try:
        cls = _allocator_class(name)
    except LookupError as exc:
        return [f"allocator.name: {exc}"]
    fields = {f.name: f for f in msgspec.structs.fields(cls.Options)}
    problems: list[str] = []
    for key, value in options.items():
        where = f"allocator.options.{key}"
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            problems.append(f"{where}: unknown option for allocator {name!r} (known: {known})")
            continue
        try:
            msgspec.convert(value, fields[key].type)
        except msgspec.ValidationError as exc:
            problems.append(f"{where}: {str(exc).removesuffix(' - at `$`')}")
    if not problems:
        try:
            msgspec.convert(dict(options), cls.Options)
        except msgspec.ValidationError as exc:
            problems.append(f"allocator.options: {exc}")
    return problems


def build_allocator(name: str, options: Mapping[str, Any], ctx: AllocatorContext) -> Allocator:
    """Resolve `name`, decode `options` strictly into its `Options` struct and construct it.

    Raises:
        ValueError: an unknown allocator, invalid options (every problem listed), or options the
            allocator cannot honour in this context (e.g. group sizes against G).
    """
    problems = check_allocator(name, options)
    if problems:
        raise ValueError(f"invalid allocator {name!r}:\n" + "\n".join(f"  - {p}" for p in problems))
    cls = _allocator_class(name)
    return cls(msgspec.convert(dict(options), cls.Options), ctx)


__all__ = ["ALLOCATORS", "Admission", "Allocator", "AllocatorContext", "build_allocator", "check_allocator"]
