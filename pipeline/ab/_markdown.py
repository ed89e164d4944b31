"""report.md: the study's tables as a person reads them (rendered from the report.json dict)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._plots import PLOTS
from ._stats import MIN_BOOTSTRAP_SEEDS


def _num(value: Any, fmt: str = ".4g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, fmt)


def _pct(value: Any) -> str:
    return _num(value * 100, ".1f") + " %" if value is not None else "n/a"


def _interval(value: Mapping[str, Any] | None, fmt: str = ".3f") -> str:
    if value is None:
        return "n/a"
    what = "range" if value.get("kind", "bootstrap") == "range" else "CI"  # reports written before `kind`: bootstrap
    return f"{_num(value['estimate'], fmt)} [{_num(value['ci_low'], fmt)}, {_num(value['ci_high'], fmt)}] (n={value['n_pairs']}, {what})"


def _kind(value: Mapping[str, Any]) -> str:
    return "range" if value.get("kind", "bootstrap") == "range" else "CI"


def _seeds(block: Mapping[str, Any]) -> str:
    """Seeds run, and how many of them ran on a loaded machine (their wall clock is out unless kept)."""
    loaded = sum(1 for f in block["per_seed"].values() if f.get("machine_loaded"))
    return f"{block['n']} ({loaded} loaded)" if loaded else str(block["n"])


def _before_after(block: Mapping[str, Any], split: str) -> str:
    return f"{_pct(block.get(f'heldout_{split}_before'))} → {_pct(block.get(f'heldout_{split}_after'))}"


def report_markdown(report: Mapping[str, Any], title: str) -> str:
    arms, comps, base = report["arms"], report["comparisons"], report["baseline"]
    level = report["bootstrap"]["level"]
    lines = [
        f"# A/B study `{title}`",
        "",
        f"Baseline arm: `{base}`. Means over seeds; ratios and differences to the baseline are paired by seed "
        f"[low, high]: with fewer than {MIN_BOOTSTRAP_SEEDS} paired seeds the range over the seeds (marked `range`, not a "
        f"confidence interval), from {MIN_BOOTSTRAP_SEEDS} on a {level:.0%} paired percentile bootstrap interval (marked `CI`); "
        f"n = pairs. "
        f"Wall clock = {report['wall_clock']}. Held-out before / after on the `{report.get('heldout_range') or 'unnamed'}` "
        f"task range" + (f", periodic measures on `{report['curve_range']}`" if report.get("curve_range") else "") + ".",
        "",
        "## Cost",
        "",
        "| arm | seeds | wall s | wall × baseline | env steps | env steps × baseline | tokens | admitted / cut / backfilled / trained (informative) | zero-var | slot occupancy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, b in arms.items():
        c = comps.get(arm, {})
        lines.append(
            f"| {arm} | {_seeds(b)} | {_num(b.get('wall_s'), '.1f')} | {'baseline' if arm == base else _interval(c.get('wall_ratio'))} "
            f"| {_num(b.get('env_steps'), '.0f')} | {'baseline' if arm == base else _interval(c.get('env_steps_ratio'))} "
            f"| {_num(b.get('generated_tokens'), '.0f')} | {_num(b.get('groups_admitted'), '.1f')} / {_num(b.get('groups_cut'), '.1f')} / "
            f"{_num(b.get('groups_backfilled'), '.1f')} / {_num(b.get('groups_trained'), '.1f')} ({_num(b.get('informative_groups'), '.1f')}) "
            f"| {_pct(b.get('zero_variance_fraction'))} | {_pct(b.get('slot_occupancy'))} |"
        )
    lines += ["", f"## Quality (held-out: `{report.get('heldout_range') or 'unnamed'}` range)", "",
              "| arm | held-out seen before → after | unseen before → after | after − baseline (pp) | gate precision / recall |",
              "|---|---|---|---|---|"]
    for arm, b in arms.items():
        delta = comps.get(arm, {}).get("heldout_after_delta")
        delta_s = "baseline" if arm == base else (
            "n/a" if delta is None else
            f"{delta['estimate'] * 100:+.1f} [{delta['ci_low'] * 100:+.1f}, {delta['ci_high'] * 100:+.1f}] (n={delta['n_pairs']}, {_kind(delta)})")
        lines.append(f"| {arm} | {_before_after(b, 'seen')} | {_before_after(b, 'unseen')} | {delta_s} "
                     f"| {_pct(b.get('gate_precision'))} / {_pct(b.get('gate_recall'))} |")
    if report["stop_rule"]["kind"] == "target_heldout":
        lines += _target_table(report)
    if report["missing"]:
        lines += ["", "Not finished: " + ", ".join(f"{m['arm']} seed {m['seed']}" for m in report["missing"]) + "."]
    if report["notes"]:
        lines += ["", "## Notes", "", *[f"- {n}" for n in report["notes"]]]
    if plots := [f"`{name}` ({PLOTS[name]})" for name in report.get("plots", []) if name in PLOTS]:
        lines += ["", "Plots: " + ", ".join(plots) + "."]
    return "\n".join(lines) + "\n"


def _target_table(report: Mapping[str, Any]) -> list[str]:
    """The time-to-target section: seconds, env steps and tokens to the target, censored seeds counted."""
    arms, comps, base = report["arms"], report["comparisons"], report["baseline"]
    lines = ["", f"## Time to held-out success ≥ {report['stop_rule']['target']:.0%} "
              f"(periodic measures on `{report.get('curve_range') or 'unnamed'}`, stamped when their weights were published)", "",
              "A seed that never reached the target is censored: it counts at its budget (the GRPO wall clock, env "
              "steps and tokens it ran), so its figures, and a mean or ratio holding them, are lower bounds."
              + ("" if report["stop_rule"].get("stops", True) else " Every run went on to its budget after reaching the "
                 "target (`--to-budget`): the held-out figures above are each arm's at the same budget."), "",
              "| arm | seconds (mean over seeds, censored ones at their budget) | reached | censored | × baseline "
              "| env steps to target | × baseline | tokens to target | × baseline |",
              "|---|---|---|---|---|---|---|---|---|"]
    for arm, b in arms.items():
        flags = [f.get("target_reached") for f in b["per_seed"].values()]
        reached, censored = sum(1 for x in flags if x == 1.0), sum(1 for x in flags if x == 0.0)
        c = comps.get(arm, {})

        def ratio(key: str, c: Mapping[str, Any] = c, arm: str = arm) -> str:
            return "baseline" if arm == base else _interval(c.get(key))

        lines.append(f"| {arm} | {_num(b.get('time_to_target_s'), '.1f')} | {reached}/{b['n']} | {censored} "
                     f"| {ratio('time_to_target_ratio')} | {_num(b.get('env_steps_to_target'), '.0f')} "
                     f"| {ratio('env_steps_to_target_ratio')} | {_num(b.get('tokens_to_target'), '.0f')} "
                     f"| {ratio('tokens_to_target_ratio')} |")
    return lines
