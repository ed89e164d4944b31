"""Arms and budgets: named TOML fragments of the run config, one file each, merged over a base config.

    configs/arms/gate.toml        an arm: what differs between the compared pipelines
    configs/budgets/tiny.toml     a budget: how big every run of a study is (model, updates, tasks)

A fragment is ordinary config TOML (any section, any key, like `--set`); it is flattened to `--set`
overrides so it merges key by key: `[allocator.options] p_easy = 0.3` changes that one option and keeps
the rest. The comment block at the top of the file is its description (`run.py ab list` prints it).
A user adds an arm or a budget by adding a file; `--arms path/to/mine.toml` also works.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    overrides: tuple[str, ...]
    """The fragment as `section.key=value` overrides, in file order."""
    description: str


def toml_value(value: Any) -> str:
    """A TOML literal for `value` (the right-hand side of `--set key=value`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value)  # a JSON number or string is also a TOML one
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def flatten(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Nested tables -> leaf `a.b.c=value` overrides (lists, arrays of tables included, stay whole)."""
    out: list[str] = []
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping) and value:
            out += flatten(value, path)
        else:
            out.append(f"{path}={toml_value(value)}")
    return out


def _description(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(line for line in lines if line)


def load_preset(path: Path) -> Preset:
    """Read one fragment file; a missing or invalid file is a ConfigError."""
    try:
        text = path.read_text()
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such file"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    return Preset(path.stem, path, tuple(flatten(data)), _description(text))


def list_presets(directory: Path) -> list[Preset]:
    return [load_preset(p) for p in sorted(directory.glob("*.toml"))]


def find_presets(names: Sequence[str], directory: Path, kind: str) -> list[Preset]:
    """Presets by name (a file `directory/<name>.toml`) or by path (ends in .toml); every unknown name
    is reported in one ConfigError with the known ones."""
    found: list[Preset] = []
    problems: list[str] = []
    for name in names:
        path = Path(name) if name.endswith(".toml") else directory / f"{name}.toml"
        if not path.is_file():
            known = ", ".join(p.stem for p in sorted(directory.glob("*.toml"))) or "none"
            problems.append(f"{kind} {name!r}: no file {path} (known {kind}s: {known})")
            continue
        try:
            found.append(load_preset(path))
        except ConfigError as exc:
            problems += exc.problems
    names_seen = [p.name for p in found]
    problems += [f"{kind} {n!r} is given twice" for n in sorted({n for n in names_seen if names_seen.count(n) > 1})]
    if problems:
        raise ConfigError(problems)
    return found
