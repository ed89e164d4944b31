"""Wall-clock figures a study can trust: time to a held-out target, and runs on a loaded machine.

Time to target is the GRPO wall second at which the weights of the first periodic held-out measure at or
above the target were *published* (metrics.jsonl stamps each `heldout/...` row so: `pipeline/run/heldout.py`),
read from the periodic measures only — the ones the stop rule watches (`eval.curve_range`, valid by default),
never the before / after measure of another task range. A run that never reached the target is *censored*
at its budget: its time counts as the GRPO wall clock it ran (a lower bound on its true time), it is counted
and shown, never dropped; a ratio of such times is then a bound too, and the report says how many seeds were
censored in each arm.

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
