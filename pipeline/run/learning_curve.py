"""`learning_curve.png`: held-out success against wall seconds and against env steps, via matplotlib Agg.

Drawn from the `heldout/...` rows of metrics.jsonl (written every `eval.every` updates, on `eval.curve_range`)
plus the before and after measures (on `eval.range`), one line per split and range, so a user sees whether RL
helps, and how fast, without opening a notebook.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def curve_points(before: Mapping[str, float], rows: Sequence[Mapping[str, Any]], after: Mapping[str, float] | None,
                 *, final_wall_s: float, final_env_steps: int, measure_range: str = "dev",
                 curve_range: str = "valid") -> dict[str, list[tuple[float, float, float]]]:
    """Per split and task range, named "<split> (<range>)" (the split without its `heldout_` prefix, as in
    metrics.jsonl): (wall_s, env_steps, success) points in order. The before and after measures read
    `measure_range`, the periodic rows `curve_range`; where the two differ they are separate series (tasks
    of another range are not the same measure), else one series from (0, 0, before) to the after point."""
    def name(split: str, range_name: str) -> str:
        return f"{split.removeprefix('heldout_')} ({range_name})"

    points: dict[str, list[tuple[float, float, float]]] = {
        name(split, measure_range): [(0.0, 0.0, value)] for split, value in before.items()
    }
    for row in rows:
        for key, value in row.items():
            if key.startswith("heldout/") and key != "heldout/mean":
                series = name(key.removeprefix("heldout/"), row.get("heldout_range", curve_range))
                points.setdefault(series, []).append((row["wall_s"], row["env_steps"], value))
    for split, value in (after or {}).items():
        if (series := name(split, measure_range)) in points:
            points[series].append((final_wall_s, float(final_env_steps), value))
    return points


def write_learning_curve(path: Path, points: Mapping[str, list[tuple[float, float, float]]], title: str) -> bool:
    """Draw the curve; returns False (with a logged note) when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, safe off the main thread
    except ImportError:
        log.info("learning_curve_skipped", reason="matplotlib not installed (pip install rollcut[plot])")
        return False
    fig = Figure(figsize=(10, 4), layout="constrained")
    by_wall, by_steps = fig.subplots(1, 2, sharey=True)
    for split, series in points.items():
        by_wall.plot([p[0] for p in series], [p[2] for p in series], marker="o", label=split)
        by_steps.plot([p[1] for p in series], [p[2] for p in series], marker="o", label=split)
    by_wall.set(xlabel="GRPO wall seconds", ylabel="held-out success (greedy)", ylim=(0, 1))
    by_steps.set(xlabel="env steps")
    by_wall.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    return True
