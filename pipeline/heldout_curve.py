"""A run folder's held-out curve measured off its clock: which published weights it kept
(`checkpoints/policy-v<N>.pt`), the stamp of the update that published each (metrics.jsonl), and the rows of
`heldout_curve.jsonl` (`pipeline/run/offclock.py` measures and writes them; the A/B harness and report read
them). Files only: no model, no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CURVE_FILE = "heldout_curve.jsonl"
_WEIGHTS = re.compile(r"policy-v(\d+)\.pt$")


def kept_versions(run_dir: Path) -> dict[int, Path]:
    """The versions whose published weights the run kept, and their files."""
    folder = run_dir / "checkpoints"
    found = {int(m.group(1)): p for p in folder.glob("policy-v*.pt") if (m := _WEIGHTS.search(p.name))} if folder.is_dir() else {}
    return dict(sorted(found.items()))


def stamps(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per update (metrics.jsonl `iteration`): the GRPO wall clock, env steps and generated tokens when it was published."""
    path = run_dir / "metrics.jsonl"
    out: dict[int, dict[str, float]] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("iteration"), int) and "wall_s" in row and not any(k.startswith("heldout/") for k in row):
            out[row["iteration"]] = {k: row[k] for k in ("wall_s", "env_steps", "generated_tokens") if isinstance(row.get(k), int | float)}
    return out


def measured(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The rows of heldout_curve.jsonl by version (a line a crash cut short is skipped: that version is measured again)."""
    path = run_dir / CURVE_FILE
    out: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("iteration"), int):
            out[row["iteration"]] = row
    return out


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """One row on a line of its own, even after a line a crash cut short."""
    cut = path.is_file() and not path.read_bytes().endswith(b"\n") and path.stat().st_size > 0
    with path.open("a") as f:
        f.write(("\n" if cut else "") + json.dumps(row) + "\n")


def curve_row(version: int, stamp: Mapping[str, float], scores: Mapping[str, float], range_name: str) -> dict[str, Any]:
    """One row of heldout_curve.jsonl: the version's stamp and its scores, as the in-run `heldout/...` rows."""
    return {"iteration": version, **stamp, **{f"heldout/{k}": v for k, v in scores.items()}, "heldout_range": range_name,
            "measured": "after the run, off its clock"}


def unmeasured(run_dir: Path) -> dict[int, Path]:
    """The kept versions heldout_curve.jsonl has no row for (none: the curve is complete)."""
    done = measured(run_dir)
    return {v: p for v, p in kept_versions(run_dir).items() if v not in done}
