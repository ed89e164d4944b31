"""What the help and the pages name exists: every `configs/...`, `docs/...` and `bench/...` path in `run.py
--help` (and `run.py ab --help`), the README and docs/; and the README's gate variation applies the point it
names (the learn regime's, configs/arms/gate-stall-learn.toml), not the gate's base-regime defaults."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import msgspec
import pytest

import run
from gates.stall import StallGate
from pipeline.run.checks import load

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"(?<![\w./-])((?:configs|docs|bench)/[\w.<>*{}/-]*)")
WRITTEN = re.compile(r"(?:--out[ =]|> )$")  # what a command is told to write need not exist before it runs
PLACEHOLDER = re.compile(r"[<>*{}]")  # configs/arms/<name>.toml, docs/ab/cost-study/runs/*-s11: patterns, not paths


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        run.main(argv)
    return out.getvalue()


def named_paths(text: str) -> set[str]:
    """The repository paths a text names (trailing punctuation and Markdown stripped; patterns left out)."""
    paths = {m.group(1).rstrip(".,:;)`'\"") for m in NAMED.finditer(text) if not WRITTEN.search(text[max(0, m.start() - 6):m.start()])}
    return {p for p in paths if not PLACEHOLDER.search(p)}


def test_the_scan_finds_a_path_and_skips_a_pattern() -> None:
    text = "see `configs/learn.toml`, [x](docs/gate.md). and configs/arms/<name>.toml or ../docs/x.md"
    assert named_paths(text) == {"configs/learn.toml", "docs/gate.md"}


def test_every_path_the_help_and_the_pages_name_exists() -> None:
    texts = {"run.py --help": _help(["--help"]), "run.py ab --help": _help(["ab", "--help"]),
             "README.md": (ROOT / "README.md").read_text()}
    texts |= {str(page.relative_to(ROOT)): page.read_text() for page in sorted((ROOT / "docs").rglob("*.md"))}
    assert "configs/learn.toml" in named_paths(texts["run.py --help"])  # the scan reads the help
    missing = sorted(f"{where}: {path}" for where, text in texts.items()
                     for path in named_paths(text) if not (ROOT / path).exists())
    assert not missing, "named but missing:\n" + "\n".join(missing)


def _gate_options(cfg: object) -> StallGate.Options:
    return msgspec.convert(cfg.gate.gate_options(), StallGate.Options)  # type: ignore[attr-defined]


def test_the_readme_gate_variation_applies_the_learn_regime_point() -> None:
    line = next(line for line in (ROOT / "README.md").read_text().splitlines()
                if "run.py --set gate.enabled=true" in line and "run.name=gated" in line)
    words = shlex.split(line.split("#", 1)[0])
    overrides = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    cfg = load(run.DEFAULT_RUN, overrides)
    point = load(ROOT / "configs" / "arms" / "gate-stall-learn.toml", [])
    assert cfg.gate.enabled and cfg.gate.name == point.gate.name == "stall"
    assert _gate_options(cfg) == _gate_options(point)
    assert _gate_options(cfg) != StallGate.Options()  # not the base regime's defaults
    assert "gate-stall-learn.toml" in line
