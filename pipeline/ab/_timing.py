"""Wall-clock figures a study can trust: time to a held-out target, and runs on a loaded machine.

Time to target is the GRPO wall second at which the weights of the first periodic held-out measure at or
above the target were *published* (metrics.jsonl stamps each `heldout/...` row so: `pipeline/run/heldout.py`),
read from the periodic measures only — the ones the stop rule watches (`eval.curve_range`, valid by default),
never the before / after measure of another task range. A run that never reached the target is *censored*.

Every arm is compared at one common wall budget, the horizon: the smallest GRPO wall clock any run of the
study had (no run was watched longer than that, so a target reached later counts as not reached). Per arm the
report gives how many seeds reached the target within it and the *restricted mean time to target*: the mean
over seeds of min(time, horizon), a censored seed counting at the horizon, with its Student-t interval.
A ratio of times to the baseline's is a number only when the baseline reached the target on every paired
seed; else it is "not reached" (with a censored baseline it bounds nothing).

A run whose summary flags a loaded machine (`machine_loaded`: its mean 1-minute load above the cores
available to it while other processes took >= a tenth of them; `pipeline/machine_load.py`) has its wall
clocks (`WALL_KEYS`) left out of the means and ratios unless the study is told to keep them
(`--keep-loaded-wall`); its env steps, tokens and held-out figures stay in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.machine_load import is_loaded
from pipeline.student_t import t_interval

from ._stats import paired_ratio

WALL_KEYS = ("wall_s", "job_wall_s", "time_to_target_s")
"""Report figures that are wall clocks (a loaded machine's are left out)."""


class Measured(Protocol):
    wall_s: float
    mean: float
    periodic: bool
    env_steps: float | None
    tokens: float | None


@dataclass(frozen=True)
class TimeToTarget:
    seconds: float
    reached: bool
    """False: the run never reached the target, `seconds` is its budget (censored)."""
    env_steps: float | None = None
    tokens: float | None = None
    """Env steps and generated tokens of the GRPO phase when those weights were published (censored: the
    run's totals); None where the run did not record them."""


def time_to_target(curve: Sequence[Measured], target: float, budget_s: float | None,
                   budget_env_steps: float | None = None, budget_tokens: float | None = None) -> TimeToTarget | None:
    """The publish time (and env steps, tokens) of the first periodic measure at or above `target`; else
    censored at the run's budget (the GRPO wall clock, env steps and tokens it had); None when it never
    reached the target and its budget is unknown."""
    reached = next((p for p in curve if p.periodic and p.mean >= target), None)
    if reached is not None:
        return TimeToTarget(reached.wall_s, True, reached.env_steps, reached.tokens)
    return TimeToTarget(budget_s, False, budget_env_steps, budget_tokens) if budget_s is not None else None


def loaded_flag(summary: Mapping[str, Any]) -> float | None:
    """1.0 / 0.0 whether the run's summary flags a loaded machine; None when it recorded no load."""
    flag = summary.get("machine_loaded")
    if not isinstance(flag, bool):
        flag = is_loaded(summary)
    return None if flag is None else float(flag)


def load_note(arm: str, seed: int, summary: Mapping[str, Any], kept: bool) -> str:
    """One line naming a loaded run, its load and what the report did with its wall clock."""
    load, cores, other = summary.get("load_1m_mean"), summary.get("cores_available"), summary.get("other_cpu_cores")
    others = f", other processes {other:.2f} cores" if isinstance(other, int | float) else ""
    told = ("kept in wall means and ratios (--keep-loaded-wall)" if kept else
            "left out of wall means and ratios (--keep-loaded-wall keeps it); its env steps, tokens and held-out figures stay in")
    return f"{arm} seed {seed} ran on a loaded machine (mean 1-minute load {load:.2f} on {cores} cores{others}): its wall clock is {told}"


def horizon(budgets: Sequence[float | None]) -> float | None:
    """The common wall budget: the smallest GRPO wall clock among the runs that count (a loaded run's wall clock
    does not, unless kept; None: no run has one)."""
    known = [b for b in budgets if b is not None]
    return min(known) if known else None


def restricted(reached: TimeToTarget | None, limit: float) -> tuple[float, bool] | None:
    """(min(time, limit), reached within the limit); None when the run's time is unknown."""
    if reached is None:
        return None
    within = reached.reached and reached.seconds <= limit
    return (reached.seconds if within else limit), within


def restricted_mean(times: Mapping[int, tuple[float, bool]], limit: float, level: float = 0.95) -> dict[str, Any]:
    """The restricted mean time to target over seeds (censored ones at `limit`), its Student-t interval, and how
    many seeds reached the target within `limit`."""
    if not times:
        return {"horizon_s": limit, "reached": 0, "n": 0, "estimate": None, "ci_low": None, "ci_high": None}
    mean, low, high = t_interval([t for t, _ in times.values()], level)
    return {"horizon_s": limit, "reached": sum(1 for _, r in times.values() if r), "n": len(times),
            "estimate": mean, "ci_low": low, "ci_high": high}


def time_ratio(base: Mapping[int, tuple[float, bool]], arm: Mapping[int, tuple[float, bool]],
               level: float = 0.95) -> dict[str, Any]:
    """Geometric mean over paired seeds of arm time / baseline time, or "not reached" when the baseline is
    censored on any paired seed (then the ratio is no bound: the baseline's true time is unknown). An arm
    censored where the baseline reached counts at the horizon: its ratio is then a lower bound (said so)."""
    seeds = sorted(base.keys() & arm.keys())
    censored = [s for s in seeds if not base[s][1]]
    if not seeds:
        return {"status": "no pairs", "n_pairs": 0}
    if censored:
        return {"status": "not reached", "baseline_censored": len(censored), "n_pairs": len(seeds),
                "censored_seeds": censored}
    ratio = paired_ratio({s: base[s][0] for s in seeds}, {s: arm[s][0] for s in seeds}, level=level)
    arm_censored = [s for s in seeds if not arm[s][1]]
    return {"status": "lower bound" if arm_censored else "ratio", "arm_censored": len(arm_censored),
            **(ratio.to_json() if ratio is not None else {"estimate": None, "n_pairs": len(seeds)})}
