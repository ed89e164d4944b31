"""What a tracker is given: the numbers of a metrics row, of the summary, and the config as flat parameters.

Pure functions, so the mapping from rollcut's rows to a tracker's scalars is tested without any tracker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

STEP = "iteration"
"""The x axis of every tracker: the learner version a row belongs to."""

HELDOUT = "heldout/"


def scalars(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of `values` (bools as 0 / 1); None, NaN, text, lists and tables are left out."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, bool | int | float) and math.isfinite(value):
            out[key] = float(value)
    return out


def tracker_row(row: Mapping[str, Any]) -> tuple[int, dict[str, float]]:
    """(step, scalars) of one metrics.jsonl row, the step left out of the scalars.

    A held-out row (`pipeline.run.heldout`) also carries the measure's own `wall_s`, `env_steps` and `eval_s`;
    they go under `heldout/` so they never overwrite the update row of the same step (`wall_s` at step 10
    is the update's, `heldout/wall_s` the measure's, which ended later).
    """
    step = int(row.get(STEP, 0))
    values = scalars({k: v for k, v in row.items() if k != STEP})
    if any(k.startswith(HELDOUT) for k in values):
        values = {k if k.startswith(HELDOUT) else HELDOUT + k: v for k, v in values.items()}
    return step, values


def summary_scalars(figures: Mapping[str, Any]) -> dict[str, float]:
    """The summary's numbers under `summary/` (its tables and lists are in summary.json / summary.md)."""
    return {f"summary/{k}": v for k, v in scalars(figures).items()}


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """The resolved config as `section.key -> value text` (tables of options flattened too; lists kept
    whole, as TOML-ish text): what a tracker shows as a run's parameters."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flat_params(value, name + ".")
        elif value is not None:
            out[name] = _text(value)
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{}"
    return str(value)
