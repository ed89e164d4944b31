"""The study's controls: the A/A arm's noise floor, rotated arm order, degenerate seeds. Pure functions.

The A/A arm changes nothing that should matter: by default it is the baseline arm again under another name
(`<baseline>-aa`, the same config), so its ratio to the baseline is what order, drift and machine alone
do to a figure. A study may name one of its own arms instead (`--aa-arm`): a gate in shadow mode, which
decides but never cuts, also controls for the gate's own CPU cost. Its distance from "no effect" is the
*noise floor* of each figure: |log ratio| for a ratio, |difference| for a difference. Another arm's effect
is "resolved" only when its interval excludes no-effect AND its point estimate lies further from it than the
floor; otherwise the report says "not resolved", whatever the interval says.

Arm order rotates per seed as a cyclic Latin square: seed i (in the study's seed order) runs the arms
starting at arm i mod k, so each arm takes each position equally often over k seeds and no arm always runs
first on a machine that warms up or slows down.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

RESOLVED, NOT_RESOLVED, NO_FLOOR = "resolved", "not resolved", "no A/A floor"


def rotated_order(arms: Sequence[str], seeds: Sequence[int]) -> dict[int, list[str]]:
    """The arm order of each seed: a cyclic Latin square over the seeds in study order."""
    k = len(arms)
    return {seed: [arms[(i + j) % k] for j in range(k)] for i, seed in enumerate(seeds)}


def aa_name(baseline: str) -> str:
    """The A/A arm's name when it is the baseline run again."""
    return f"{baseline}-aa"


def effect_size(interval: Mapping[str, Any] | None, ratio: bool) -> float | None:
    """Distance of a comparison's estimate from no effect: |log ratio| or |difference|."""
    if not interval or interval.get("estimate") is None:
        return None
    est = float(interval["estimate"])
    if ratio:
        return abs(math.log(est)) if est > 0 else None
    return abs(est)


def resolution(interval: Mapping[str, Any] | None, floor: float | None, ratio: bool) -> str | None:
    """"resolved", "not resolved" (the interval holds no-effect, or the effect is within the A/A floor) or
    "no A/A floor" (the interval excludes no-effect but the study had no A/A arm); None: no comparison."""
    size = effect_size(interval, ratio)
    if interval is None or size is None:
        return None
    low, high, null = interval.get("ci_low"), interval.get("ci_high"), 1.0 if ratio else 0.0
    if low is None or high is None or low <= null <= high:
        return NOT_RESOLVED
    if floor is None:
        return NO_FLOOR
    return RESOLVED if size > floor else NOT_RESOLVED


def degenerate_seeds(updates: Mapping[int, Sequence[float | None]]) -> list[int]:
    """Seeds on which every arm that finished made 0 learner updates: nothing was learned, every arm ran to its
    safety wall, so their figures measure the wall, not the arms. Reported apart, never averaged."""
    return sorted(s for s, values in updates.items() if values and all(v == 0 for v in values))


def machines(ids: Mapping[tuple[str, int], str | None]) -> dict[str, Any]:
    """The machines the runs ran on (machine.json's id per run): the distinct ids, and the runs without one."""
    known = sorted({m for m in ids.values() if m})
    return {"ids": known, "spans_machines": len(known) > 1,
            "runs_without_id": sorted(f"{a}-s{s}" for (a, s), m in ids.items() if not m)}


def screen_seeds(candidates: Sequence[int], want: int, measure: Callable[[int], float | None], low: float,
                 high: float) -> tuple[list[int], dict[int, str]]:
    """Seeds for a study, screened before any arm runs: draw `candidates` in order, measure each one's warm start
    (`measure`: held-out success on dev, None when it could not be measured) and keep it when low <= success <=
    high, until `want` are kept. Returns the kept seeds and, for each seed left out, why (the report lists them)."""
    kept: list[int] = []
    out: dict[int, str] = {}
    for seed in candidates:
        if len(kept) == want:
            break
        success = measure(seed)
        if success is None:
            out[seed] = "its warm start could not be measured on dev"
        elif low <= success <= high:
            kept.append(seed)
        else:
            out[seed] = f"warm start wins {success:.1%} on dev, outside [{low:.0%}, {high:.0%}]".replace("%", " %")
    return kept, out
