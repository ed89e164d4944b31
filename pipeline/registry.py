"""Name -> factory registries for every extension point.

Built-ins and users' plugins go through the same path: a registry entry is a `module:attr` string that is
imported on first use. Entries come from (1) the built-in table passed at construction, (2) the installed
entry-point group (`rollcut.<kind>`), (3) `register()` calls; a config may also name `module:attr`
directly, which needs no registration at all.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def load_object(target: str) -> Any:
    """Import `module:attr` (attr may be dotted). Raises LookupError with a readable message."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise LookupError(f"{target!r} is not of the form 'module:attr'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise LookupError(
            f"cannot import module {module_name!r} for {target!r}: {exc} (a plugin module must be importable: "
            f"run from the folder that holds it, add that folder to PYTHONPATH, or pip install its package)"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LookupError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def dotted_hint(name: str) -> str:
    """For `pkg.mod.Class`: a plugin path names its module and attribute apart, `pkg.mod:Class`."""
    module, dot, attr = name.rpartition(".")
    if not dot or not module or not attr:
        return ""
    return f"; a plugin path is written module:attr, e.g. {module + ':' + attr!r}"


class Registry:
    """A named set of `module:attr` targets for one extension point (e.g. gates, allocators)."""

    def __init__(self, kind: str, builtins: Mapping[str, str]) -> None:
        self.kind = kind
        self.group = f"rollcut.{kind}"
        self._targets: dict[str, str] = dict(builtins)
        self._entry_points_loaded = False

    def register(self, name: str, target: str) -> None:
        """Add `name -> module:attr`. Raises ValueError on a duplicate name with another target."""
        known = self._targets.get(name)
        if known is not None and known != target:
            raise ValueError(f"{self.kind} {name!r} is already registered as {known!r}")
        self._targets[name] = target

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in importlib.metadata.entry_points(group=self.group):
            try:
                self.register(ep.name, ep.value)
            except ValueError:
                log.warning("registry.duplicate_entry_point", group=self.group, name=ep.name, value=ep.value)

    def names(self) -> list[str]:
        self._load_entry_points()
        return sorted(self._targets)

    def target(self, name: str) -> str:
        if ":" in name:
            return name
        self._load_entry_points()
        try:
            return self._targets[name]
        except KeyError:
            raise LookupError(f"unknown {self.kind} {name!r} (known: {', '.join(self.names())}){dotted_hint(name)}") from None

    def get(self, name: str) -> Any:
        """The object registered as `name`, or `module:attr` loaded directly."""
        return load_object(self.target(name))

    def check(self, name: str, where: str) -> list[str]:
        """Problems resolving `name` (for config validation), as a list of messages."""
        try:
            self.get(name)
        except LookupError as exc:
            return [f"{where}: {exc}"]
        return []
