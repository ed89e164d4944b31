"""The one plugin convention: a plugin's options are a strict msgspec Struct named `Options` on the plugin.

Every extension point builds its plugin the same way. The config section's `options` table is decoded
strictly into `Plugin.Options` (a `msgspec.Struct` with `forbid_unknown_fields=True`; its field defaults
are the only defaults, and `msgspec.Meta` constraints are its range checks), and the plugin is constructed
with that struct as its first argument, followed by whatever the extension point adds (an allocator's
context, an environment's step limit). A plugin without an `Options` attribute takes no options: it is
constructed without them, and a non-empty options table is a config error.

`option_problems` lists every problem of a table at once (each unknown key, each mistyped or out-of-range
value), which is what `run.py check` prints before it exits 2; `build_plugin` raises `ValueError` with the
same lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec


def options_class(plugin: Any) -> type[msgspec.Struct] | None:
    """The plugin's `Options` Struct, None if it takes no options. Raises TypeError for any other `Options`."""
    options = getattr(plugin, "Options", None)
    if options is None:
        return None
    if not (isinstance(options, type) and issubclass(options, msgspec.Struct)):
        raise TypeError(f"{getattr(plugin, '__qualname__', plugin)!r}: `Options` must be a msgspec Struct")
    return options


def option_problems(plugin: Any, table: Mapping[str, Any], where: str, label: str) -> list[str]:
    """Every problem of the options `table` (at config path `where`) for `plugin` (named `label` in the
    messages): each unknown key, each mistyped or out-of-range value, then (only if each is fine alone)
    whatever the Struct rejects as a whole (`__post_init__`). Empty when the table decodes."""
    try:
        cls = options_class(plugin)
    except TypeError as exc:
        return [f"{where}: {exc}"]
    if cls is None:
        return [f"{where}: {label} takes no options (got {', '.join(sorted(table))})"] if table else []
    fields = {f.name: f for f in msgspec.structs.fields(cls)}
    problems: list[str] = []
    for key, value in table.items():
        if key not in fields:
            known = ", ".join(sorted(fields)) or "none"
            problems.append(f"{where}.{key}: unknown option for {label} (known: {known})")
            continue
        try:
            msgspec.convert(value, fields[key].type)
        except msgspec.ValidationError as exc:
            problems.append(f"{where}.{key}: {str(exc).removesuffix(' - at `$`')}")
    if not problems:
        try:
            msgspec.convert(dict(table), cls)
        except msgspec.ValidationError as exc:
            problems.append(f"{where}: {exc}")
    return problems


def decode_options(plugin: Any, table: Mapping[str, Any], where: str, label: str) -> msgspec.Struct | None:
    """`table` decoded into `plugin.Options` (None for a plugin without options).

    Raises:
        ValueError: listing every problem (`option_problems`).
    """
    problems = option_problems(plugin, table, where, label)
    if problems:
        raise ValueError(f"invalid options for {label}:\n" + "\n".join(f"  - {p}" for p in problems))
    cls = options_class(plugin)
    return None if cls is None else msgspec.convert(dict(table), cls)


def build_plugin(plugin: Any, table: Mapping[str, Any], where: str, label: str, *args: Any, **kwargs: Any) -> Any:
    """`plugin(options, *args, **kwargs)` with `table` decoded strictly, or `plugin(*args, **kwargs)` for a
    plugin without `Options` (then `table` must be empty). Raises ValueError listing every problem."""
    options = decode_options(plugin, table, where, label)
    return plugin(*args, **kwargs) if options is None else plugin(options, *args, **kwargs)
