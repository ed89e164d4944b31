"""report.md: the study's tables as a person reads them (rendered from the report.json dict)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._plots import PLOTS


def _num(value: Any, fmt: str = ".4g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, fmt)


def _pct(value: Any) -> str:
    return _num(value * 100, ".1f") + " %" if value is not None else "n/a"


def _interval(value: Mapping[str, Any] | None, fmt: str = ".3f", verdict: str | None = None) -> str:
    """estimate [low, high] (n=N), and "not resolved" where the comparison is not (`_control.resolution`)."""
    if value is None:
        return "n/a"
    if value.get("ci_low") is None:
        text = f"{_num(value['estimate'], fmt)} (n={value['n_pairs']}, no interval)"
    else:
        text = f"{_num(value['estimate'], fmt)} [{_num(value['ci_low'], fmt)}, {_num(value['ci_high'], fmt)}] (n={value['n_pairs']})"
    return text + (f" **{verdict}**" if verdict and verdict != "resolved" else " resolved" if verdict else "")


def _seeds(block: Mapping[str, Any]) -> str:
    """Seeds run, and how many of them ran on a loaded machine (their wall clock is out unless kept)."""
    loaded = sum(1 for f in block["per_seed"].values() if f.get("machine_loaded"))
    return f"{block['n']} ({loaded} loaded)" if loaded else str(block["n"])


def _before_after(block: Mapping[str, Any], split: str) -> str:
    return f"{_pct(block.get(f'heldout_{split}_before'))} → {_pct(block.get(f'heldout_{split}_after'))}"


def _headline(report: Mapping[str, Any], title: str) -> list[str]:
    base, aa = report["baseline"], report.get("aa_arm")
    level = report["intervals"]["level"]
    machines = report.get("machines") or {}
    rotated = len({tuple(o) for o in (report.get("order") or {}).values()}) > 1
    spans = (f" **This study spans {len(machines['ids'])} machines** ({', '.join(m if len(m) <= 16 else m[:8] for m in machines['ids'])}): "
             "machine is a factor besides the arm" + ("; the arm order rotated per seed spreads it, it does not remove it."
                                                       if rotated else ", and the arms ran in one fixed order.")
             if machines.get("spans_machines") else "")
    return [
        f"# A/B study `{title}`",
        "",
        f"Baseline arm: `{base}`. A/A control arm: " + (f"`{aa}` (changes nothing against `{report.get('aa_of') or base}`: its distance from it is the "
        "noise floor; an effect within it, or whose interval holds no-effect, is marked **not resolved**)." if aa else
        "none (a study made before the A/A arm: no noise floor).") + spans,
        "",
        f"Means over seeds. Ratios to the baseline are geometric means of per-seed ratios, differences are paired per "
        f"seed, both with {level * 100:g} % Student-t intervals on the per-seed values [low, high]; n = pairs. "
        f"Wall clock = {report['wall_clock']}. Held-out before / after on the `{report.get('heldout_range') or 'unnamed'}` "
        f"task range" + (f", periodic measures on `{report['curve_range']}`" if report.get("curve_range") else "") + ".",
    ]


def _verdict(report: Mapping[str, Any], arm: str, name: str) -> str | None:
    return (report.get("resolution") or {}).get(arm, {}).get(name)


def _ratio_cell(report: Mapping[str, Any], arm: str, name: str) -> str:
    if arm == report["baseline"]:
        return "baseline"
    label = "A/A: " if arm == report.get("aa_arm") else ""
    return label + _interval(report["comparisons"].get(arm, {}).get(name), verdict=_verdict(report, arm, name))


def report_markdown(report: Mapping[str, Any], title: str) -> str:
    arms, comps, base = report["arms"], report["comparisons"], report["baseline"]
    lines = [*_headline(report, title), "", "## Cost", "",
             "| arm | seeds | wall s | wall × baseline | env steps | env steps × baseline | tokens | env steps per informative group "
             "| × baseline | admitted / cut / backfilled / trained (informative) | zero-var | slot occupancy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, b in arms.items():
        lines.append(
            f"| {arm} | {_seeds(b)} | {_num(b.get('wall_s'), '.1f')} | {_ratio_cell(report, arm, 'wall_ratio')} "
            f"| {_num(b.get('env_steps'), '.0f')} | {_ratio_cell(report, arm, 'env_steps_ratio')} "
            f"| {_num(b.get('generated_tokens'), '.0f')} | {_num(b.get('env_steps_per_informative_group'), '.1f')}"
            f"{' (estimated)' if (b.get('ledger') or {}).get('estimated') else ''} "
            f"| {_ratio_cell(report, arm, 'env_steps_per_informative_group_ratio')} "
            f"| {_num(b.get('groups_admitted'), '.1f')} / {_num(b.get('groups_cut'), '.1f')} / "
            f"{_num(b.get('groups_backfilled'), '.1f')} / {_num(b.get('groups_trained'), '.1f')} ({_num(b.get('informative_groups'), '.1f')}) "
            f"| {_pct(b.get('zero_variance_fraction'))} | {_pct(b.get('slot_occupancy'))} |"
        )
    lines += _floor_lines(report)
    lines += _ledger_table(report)
    lines += ["", f"## Quality (held-out: `{report.get('heldout_range') or 'unnamed'}` range)", "",
              "| arm | held-out seen before → after | unseen before → after | after − baseline (pp) | gate precision / recall |",
              "|---|---|---|---|---|"]
    for arm, b in arms.items():
        delta = comps.get(arm, {}).get("heldout_after_delta")
        verdict = _verdict(report, arm, "heldout_after_delta")
        delta_s = "baseline" if arm == base else ("n/a" if delta is None else (
            ("A/A: " if arm == report.get("aa_arm") else "") + _interval(
                {**delta, **{k: (delta[k] * 100 if delta.get(k) is not None else None) for k in ("estimate", "ci_low", "ci_high")}},
                "+.1f", verdict)))
        lines.append(f"| {arm} | {_before_after(b, 'seen')} | {_before_after(b, 'unseen')} | {delta_s} "
                     f"| {_pct(b.get('gate_precision'))} / {_pct(b.get('gate_recall'))} |")
    if report["stop_rule"]["kind"] == "target_heldout":
        lines += _target_table(report)
    lines += _apart(report)
    lines += _provenance(report)
    if report["missing"]:
        lines += ["", "Not finished: " + ", ".join(f"{m['arm']} seed {m['seed']}" for m in report["missing"]) + "."]
    if report["notes"]:
        lines += ["", "## Notes", "", *[f"- {n}" for n in report["notes"]]]
    if plots := [f"`{name}` ({PLOTS[name]})" for name in report.get("plots", []) if name in PLOTS]:
        lines += ["", "Plots: " + ", ".join(plots) + "."]
    return "\n".join(lines) + "\n"


def _floor_lines(report: Mapping[str, Any]) -> list[str]:
    floors, aa = report.get("noise_floor"), report.get("aa_arm")
    if not floors:
        return []
    aa_comp = report.get("aa_comparison") or report["comparisons"].get(aa, {})
    parts = [f"{name.removesuffix('_ratio').replace('_', ' ')} ×{aa_comp[name]['estimate']:.3f}" for name, v in floors.items()
             if v is not None and name.endswith("_ratio")]
    parts += [f"{name.removesuffix('_delta').replace('_', ' ')} {aa_comp[name]['estimate'] * 100:+.1f} pp" for name, v in floors.items()
              if v is not None and name.endswith("_delta")]
    return ["", f"Noise floor (`{aa}` against `{report.get('aa_of') or report['baseline']}`, the distance an arm that changes "
            "nothing came out at): "
            + (", ".join(parts) or "n/a") + "."]


def _ledger_table(report: Mapping[str, Any]) -> list[str]:
    """Where decoder work went: each fate's share of the arm's env steps (mean over seeds)."""
    ledgers = {arm: b["ledger"] for arm, b in report["arms"].items() if b.get("ledger")}
    if not ledgers:
        return []
    fates = list(dict.fromkeys(f for ledger in ledgers.values() for f in ledger["fates"]))
    lines = ["", "## Where decoder work went (share of env steps, mean over seeds)", "",
             "| arm | " + " | ".join(f.replace("_", " ") for f in fates) + " | learner waiting / pacer holding / slot occupancy |",
             "|---|" + "---|" * (len(fates) + 1)]
    for arm, ledger in ledgers.items():
        idle = ledger.get("idle") or {}
        idle_s = " / ".join(_pct(idle.get(k)) for k in ("learner_waiting", "pacer_holding", "slot_occupancy")) if idle else "n/a"
        lines.append(f"| {arm}{' (estimated)' if ledger['estimated'] else ''} | "
                     + " | ".join(_pct(ledger["shares"].get(f)) for f in fates) + f" | {idle_s} |")
    if any(ledger["estimated"] for ledger in ledgers.values()):
        lines += ["", "_estimated_: runs that predate the ledger; their fates are rebuilt from the counts they recorded "
                  "(pipeline/ab/_ledger.py): trained steps counted, all-fail drops at group size × step limit, the rest "
                  "not separable."]
    return lines


def _apart(report: Mapping[str, Any]) -> list[str]:
    lines = []
    if report.get("screened_out"):
        lines += ["", "## Seeds screened out before any arm ran", "",
                  *[f"- seed {s}: {why}" for s, why in report["screened_out"].items()]]
    if report.get("degenerate_seeds"):
        lines += ["", "## Degenerate seeds, reported apart (every arm made 0 updates; in no mean, ratio or interval)", "",
                  "| run | wall s | env steps | updates | stop |", "|---|---|---|---|---|"]
        for name, f in report.get("apart", {}).items():
            lines.append(f"| {name} | {_num(f.get('wall_s'), '.1f')} | {_num(f.get('env_steps'), '.0f')} "
                         f"| {_num(f.get('learner_updates'), '.0f')} | |")
    return lines


def _provenance(report: Mapping[str, Any]) -> list[str]:
    lines = []
    if report.get("order"):
        orders = {tuple(o) for o in report["order"].values()}
        how = ("the same on every seed: **not rotated**, so run order and drift are confounded with the arm"
               if len(orders) == 1 and len(report["order"]) > 1 else "rotated per seed")
        lines += ["", f"Arm order per seed ({how}): " + "; ".join(f"{s}: {', '.join(o)}" for s, o in report["order"].items()) + "."]
    commits = report.get("commits") or {}
    if commits:
        by_commit: dict[str, list[str]] = {}
        for run, commit in commits.items():
            by_commit.setdefault(commit or "not recorded", []).append(run)
        lines += ["", "Commits the runs ran at: " + "; ".join(
            f"`{c}` ({len(r)} run{'s' if len(r) != 1 else ''})" for c, r in by_commit.items()) + "."]
    return lines


def _target_table(report: Mapping[str, Any]) -> list[str]:
    """The time-to-target section: seeds reached within the common budget, restricted mean time, ratios."""
    arms, comps, base = report["arms"], report["comparisons"], report["baseline"]
    horizon = report["stop_rule"].get("horizon_s")
    lines = ["", f"## Time to held-out success ≥ {report['stop_rule']['target'] * 100:g} % "
              f"(periodic measures on `{report.get('curve_range') or 'unnamed'}`, stamped when their weights were published)", "",
              f"Every arm is compared at one wall budget, {_num(horizon, '.0f')} s of GRPO (the shortest run's): a seed that "
              "did not reach the target within it is censored there. The restricted mean time counts censored seeds at the "
              "budget; a ratio to the baseline is a number only when the baseline reached the target on every paired seed, "
              "else **inconclusive** (a censored baseline bounds nothing)."
              + ("" if report["stop_rule"].get("stops", True) else " Every run went on to its budget after reaching the "
                 "target (`--to-budget`): the held-out figures above are each arm's at the same budget."), "",
              "| arm | reached | restricted mean s [interval] | time × baseline | env steps × baseline | tokens × baseline |",
              "|---|---|---|---|---|---|"]
    for arm in arms:
        rm = (report.get("time_to_target") or {}).get(arm) or {}
        c = comps.get(arm, {})
        rm_s = _interval({"estimate": rm.get("estimate"), "ci_low": rm.get("ci_low"), "ci_high": rm.get("ci_high"),
                          "n_pairs": rm.get("n", 0)}, ".1f") if rm.get("estimate") is not None else "n/a"
        lines.append(f"| {arm} | {rm.get('reached', 0)}/{rm.get('n', 0)} | {rm_s} | "
                     + " | ".join("baseline" if arm == base else _target_ratio(c.get(k))
                                  for k in ("time_to_target_ratio", "env_steps_to_target_ratio", "tokens_to_target_ratio")) + " |")
    return lines


def _target_ratio(value: Mapping[str, Any] | None) -> str:
    if not value or value.get("status") == "no pairs":
        return "n/a"
    if value.get("status") == "not reached":
        return f"inconclusive (baseline censored on {value['baseline_censored']} of {value['n_pairs']} seeds)"
    text = _interval(value)
    return text + (f", lower bound (arm censored on {value['arm_censored']})" if value.get("status") == "lower bound" else "")
