"""The study's report: per-arm figures over seeds, paired ratios to the baseline arm, learning curves.

Pure functions from finished runs (`RunRecord`: a summary.json and the held-out rows of metrics.jsonl)
to one JSON-able dict; `report_markdown` renders it. Keys that an older or newer pipeline does not write
come out as null and are named in `notes`, never guessed.

`wall_s` here is the GRPO phase's wall clock (summary `grpo_wall_s`): the warm start (cached after a
seed's first run, ~90 s when cold) and the held-out evaluations before and after are the same work in
every arm and would only add noise. The whole job's time is `job_wall_s`.

`informative_groups` is what the learner trained on with reward variance (summary
`groups_trained_informative`, counted per update): at equal updates sync-grpo trains its zero-variance
groups (no gradient) and the async arms drop them. Not the allocator's count of groups handed to the
learner, which includes those still waiting for a batch when the run stopped.

Time to target and loaded runs follow `_timing.py`: periodic measures only, stamped at publication, every
arm compared at one common wall budget (restricted mean time, censored seeds at the horizon; a ratio to a
censored baseline is "not reached"); a run flagged `machine_loaded` keeps its env steps and tokens but its
wall clocks are left out unless `keep_loaded_wall`. Every held-out figure names its task range
(`heldout_range`, `curve_range`: pipeline/task_ranges.py).

Ratios are geometric means of per-seed ratios and differences are paired per seed, with Student-t intervals
(`_stats.py`); the A/A arm's comparison is the noise floor and every other comparison says whether it is
resolved (`_control.py`). Seeds screened out before the study ran (`screened_out`) and degenerate seeds (every
arm 0 updates) are reported apart and enter no mean, ratio or interval. Where decoder work went is the runs'
ledger, or its estimate from older records (`_ledger.py`); each run's commit is read from its folder.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.heldout_curve import measured
from pipeline.provenance import invocations

from ._control import degenerate_seeds, effect_size, machines, resolution
from ._ledger import fate_shares, run_ledger
from ._runner import finished_summary
from ._stats import PairedInterval, mean_sd, paired_difference, paired_ratio
from ._timing import (
    WALL_KEYS,
    TimeToTarget,
    horizon,
    load_note,
    loaded_flag,
    restricted,
    restricted_mean,
    time_ratio,
    time_to_target,
)

# report key -> candidate paths in summary.json, first present wins (newer key names first)
METRICS: dict[str, tuple[tuple[str, ...], ...]] = {
    "wall_s": (("grpo_wall_s",),),
    "job_wall_s": (("wall_s",),),
    "env_steps": (("env_steps",),),
    "generated_tokens": (("generated_tokens",),),
    "groups_admitted": (("groups_admitted",),),
    "groups_cut": (("groups_cut",),),
    "groups_backfilled": (("groups_backfilled",),),
    "groups_trained": (("groups_trained",),),
    "informative_groups": (("groups_trained_informative",),),
    "learner_updates": (("learner_updates",),),
    "zero_variance_fraction": (("zero_variance_fraction",),),
    "gate_precision": (("gate/precision",), ("gate_precision",)),
    "gate_recall": (("gate/recall",), ("gate_recall",)),
    "slot_occupancy": (("trajectory_slot_occupancy",), ("slot_occupancy",)),
    "staleness_lag_max": (("staleness_lag_max",),),
    "heldout_success_before": (("heldout_success_before",),),
    "heldout_success_after": (("heldout_success_after",),),
    "heldout_seen_before": (("heldout_before", "heldout_seen"),),
    "heldout_unseen_before": (("heldout_before", "heldout_unseen"),),
    "heldout_seen_after": (("heldout_after", "heldout_seen"),),
    "heldout_unseen_after": (("heldout_after", "heldout_unseen"),),
}
RATIOS = {"wall_ratio": "wall_s", "env_steps_ratio": "env_steps", "generated_tokens_ratio": "generated_tokens",
          "env_steps_per_informative_group_ratio": "env_steps_per_informative_group",
          "tokens_per_informative_group_ratio": "tokens_per_informative_group"}
TARGET_RATIOS = {"time_to_target_ratio": "time_to_target_s", "env_steps_to_target_ratio": "env_steps_to_target",
                 "tokens_to_target_ratio": "tokens_to_target"}
"""Ratios of figures at the target: a number only where the baseline reached it on every paired seed."""
DIFFERENCES = {"heldout_after_delta": "heldout_success_after", "heldout_seen_after_delta": "heldout_seen_after",
               "heldout_unseen_after_delta": "heldout_unseen_after"}


@dataclass(frozen=True)
class CurvePoint:
    wall_s: float
    mean: float
    seen: float | None = None
    unseen: float | None = None
    periodic: bool = False
    """A measure during GRPO (`eval.every`, on `eval.curve_range`, stamped when its weights were published);
    else the before (t = 0) or after measure (on `eval.range`)."""
    env_steps: float | None = None
    tokens: float | None = None
    """The GRPO phase's env steps and generated tokens when the measured weights were published."""


@dataclass(frozen=True)
class RunRecord:
    arm: str
    seed: int
    summary: Mapping[str, Any]
    curve: tuple[CurvePoint, ...]
    """Held-out success over the GRPO phase's wall clock: before (t = 0), periodic evaluations, after."""
    periodic: bool
    """Whether metrics.jsonl had periodic held-out rows (else the curve is before and after only)."""
    ledger: Mapping[str, Any] | None = None
    """Where its decoder work went (`_ledger.run_ledger`: recorded, or estimated from older records)."""
    machine: str | None = None
    """machine.json's machine id, where the run folder has one."""
    commit: str | None = None
    """The commit it ran at ("+dirty" when the tree differed), where the run folder records it."""


def _lookup(data: Mapping[str, Any], paths: tuple[tuple[str, ...], ...]) -> float | None:
    for path in paths:
        node: Any = data
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, int | float) and not isinstance(node, bool) and math.isfinite(node):
            return float(node)
    return None


def curve_from(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> tuple[tuple[CurvePoint, ...], bool]:
    """Held-out points from metrics.jsonl rows (`heldout/mean` with `wall_s`), framed by before and after."""
    def point(t: float | None, mean: float | None, seen: float | None, unseen: float | None, periodic: bool = False,
              env_steps: float | None = None, tokens: float | None = None) -> list[CurvePoint]:
        return [CurvePoint(t, mean, seen, unseen, periodic, env_steps, tokens)] if t is not None and mean is not None else []

    periodic = [p for r in rows
                for p in point(_lookup(r, (("wall_s",),)), _lookup(r, (("heldout/mean",),)),
                               _lookup(r, (("heldout/seen",),)), _lookup(r, (("heldout/unseen",),)), True,
                               _lookup(r, (("env_steps",),)), _lookup(r, (("generated_tokens",),)))]
    before = point(0.0, *(_lookup(summary, METRICS[k]) for k in ("heldout_success_before", "heldout_seen_before", "heldout_unseen_before")),
                   env_steps=0.0, tokens=0.0)
    after = point(_lookup(summary, METRICS["wall_s"]),
                  *(_lookup(summary, METRICS[k]) for k in ("heldout_success_after", "heldout_seen_after", "heldout_unseen_after")),
                  env_steps=_lookup(summary, METRICS["env_steps"]), tokens=_lookup(summary, METRICS["generated_tokens"]))
    return tuple(before + sorted(periodic, key=lambda p: p.wall_s) + after), bool(periodic)


def read_run(arm: str, seed: int, run_dir: Path) -> RunRecord | None:
    """A finished run's record; None when the folder has no summary.json, or one of an interrupted run
    (`finished_summary`: not run, or not finished)."""
    summary = finished_summary(run_dir)
    if summary is None:
        return None
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    rows += list(measured(run_dir).values())  # measured after the run, off its clock (heldout_curve.jsonl): the same rows
    curve_rows = [r for r in rows if r.get("heldout_range")]
    if not summary.get("heldout_curve_range") and curve_rows:  # measured off the clock: the rows name the range
        summary = {**summary, "heldout_curve_range": curve_rows[0]["heldout_range"]}
    curve, periodic = curve_from(summary, rows)
    config = _json_or_toml(run_dir / "config.toml")
    group_size, max_steps = config.get("rollout", {}).get("group_size"), config.get("env", {}).get("max_steps")
    zero_items = bool(config.get("learner", {}).get("keep_zero_advantage_items", True))
    machine = _json_or_toml(run_dir / "machine.json").get("machine_id")
    return RunRecord(arm, seed, summary, curve, periodic, run_ledger(summary, group_size, max_steps, zero_items),
                     machine if isinstance(machine, str) else None, run_commit(summary, run_dir))


def _json_or_toml(path: Path) -> dict[str, Any]:
    """A small record of the run folder as data ({} when absent or unreadable: the report names what is missing)."""
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text()) if path.suffix == ".toml" else json.loads(path.read_text())
    except (ValueError, tomllib.TOMLDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def run_commit(summary: Mapping[str, Any], run_dir: Path) -> str | None:
    """The commit(s) a run ran at, oldest first and joined by ", " when a resume ran another, "+dirty" appended to
    one whose tree differed: the summary's `run_commits`, else the folder's commits.jsonl
    (`pipeline/provenance.py`); None for runs that predate it."""
    lines = summary.get("run_commits")
    if not isinstance(lines, list):
        lines = invocations(run_dir)
    commits: list[str] = []
    for line in lines:
        if isinstance(line, Mapping) and isinstance(line.get("commit"), str):
            commit = line["commit"][:12] + ("+dirty" if line.get("dirty") is True else "")
            if commit not in commits:
                commits.append(commit)
    return ", ".join(commits) or None


def run_figures(record: RunRecord, target: float | None, keep_loaded_wall: bool = False) -> dict[str, float | None]:
    """The run's figures; with a target, its time to it (`target_reached` 0.0: censored at its budget); a loaded
    run's wall clocks are None unless `keep_loaded_wall`."""
    figures = {key: _lookup(record.summary, paths) for key, paths in METRICS.items()}
    figures["machine_loaded"] = loaded_flag(record.summary)
    ledger = record.ledger or {}
    figures["env_steps_per_informative_group"] = ledger.get("env_steps_per_informative_group")
    figures["tokens_per_informative_group"] = ledger.get("tokens_per_informative_group")
    if target is not None:
        reached = time_to_target(record.curve, target, figures["wall_s"], figures["env_steps"], figures["generated_tokens"])
        figures["time_to_target_s"] = reached.seconds if reached is not None else None
        figures["target_reached"] = float(reached.reached) if reached is not None else None
        figures["env_steps_to_target"] = reached.env_steps if reached is not None else None
        figures["tokens_to_target"] = reached.tokens if reached is not None else None
    if figures["machine_loaded"] and not keep_loaded_wall:
        figures |= {key: None for key in WALL_KEYS if key in figures}
    return figures


def _ledger_block(records: Sequence[RunRecord]) -> dict[str, Any] | None:
    """Mean env steps and tokens per fate over the arm's seeds, their shares, and whether any was estimated."""
    ledgers = [r.ledger for r in records if r.ledger]
    if not ledgers:
        return None
    names = list(dict.fromkeys(name for ledger in ledgers for name in ledger["fates"]))
    fates = {name: {key: mean_sd([ledger["fates"].get(name, {}).get(key) for ledger in ledgers])[0]
                    for key in ("env_steps", "tokens", "groups")} for name in names}
    shares = {name: mean_sd([fate_shares(ledger).get(name) for ledger in ledgers])[0] for name in names}
    idle = [ledger["idle"] for ledger in ledgers if ledger.get("idle")]
    return {"estimated": any(ledger["estimated"] for ledger in ledgers), "n": len(ledgers), "fates": fates, "shares": shares,
            "idle": {k: mean_sd([i.get(k) for i in idle])[0] for k in idle[0]} if idle else None}


def _arm_block(records: Sequence[RunRecord], target: float | None, keep_loaded_wall: bool) -> dict[str, Any]:
    per_seed = {r.seed: run_figures(r, target, keep_loaded_wall) for r in sorted(records, key=lambda r: r.seed)}
    keys = list(next(iter(per_seed.values()))) if per_seed else list(METRICS)
    stats = {k: mean_sd([f[k] for f in per_seed.values()]) for k in keys}
    return {
        "seeds": list(per_seed),
        "n": len(per_seed),
        **{k: m for k, (m, _sd) in stats.items()},
        "sd": {k: sd for k, (_m, sd) in stats.items()},
        "per_seed": {str(s): f for s, f in per_seed.items()},
        "stop_reasons": {str(r.seed): r.summary.get("stop_reason") for r in records},
        "ledger": _ledger_block(records),
        "commits": {str(r.seed): r.commit for r in sorted(records, key=lambda r: r.seed)},
        "machines": {str(r.seed): r.machine for r in sorted(records, key=lambda r: r.seed)},
    }


def _interval(value: PairedInterval | None) -> dict[str, Any] | None:
    return value.to_json() if value is not None else None


def _series(figs: Mapping[int, Mapping[str, Any]], key: str) -> dict[int, float | None]:
    return {s: f.get(key) for s, f in figs.items()}


def _comparison(base: Mapping[int, Mapping[str, Any]], arm: Mapping[int, Mapping[str, Any]], level: float) -> dict[str, Any]:
    out = {name: _interval(paired_ratio(_series(base, key), _series(arm, key), level=level)) for name, key in RATIOS.items()}
    out |= {name: _interval(paired_difference(_series(base, key), _series(arm, key), level=level))
            for name, key in DIFFERENCES.items()}
    return out


def _restricted_times(figs: Mapping[int, Mapping[str, Any]], limit: float) -> dict[int, tuple[float, bool]]:
    out = {}
    for seed, f in figs.items():
        if f.get("time_to_target_s") is None:
            continue
        got = restricted(TimeToTarget(f["time_to_target_s"], f.get("target_reached") == 1.0), limit)
        if got is not None:
            out[seed] = got
    return out


def _target_comparisons(per_seed: Mapping[str, Mapping[int, Mapping[str, Any]]], baseline: str, limit: float | None,
                        level: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per arm: the restricted mean time to target with its interval and seeds reached; per other arm: its ratios
    to the baseline (`time_ratio`: "not reached" where the baseline is censored on a seed)."""
    if limit is None:  # no run's wall clock counts (all loaded): no time to compare
        return ({a: {"horizon_s": None, "reached": 0, "n": 0, "estimate": None, "ci_low": None, "ci_high": None} for a in per_seed},
                {a: {k: {"status": "no pairs", "n_pairs": 0} for k in TARGET_RATIOS} for a in per_seed if a != baseline})
    times = {a: _restricted_times(figs, limit) for a, figs in per_seed.items()}
    summary = {a: restricted_mean(t, limit, level) for a, t in times.items()}
    ratios: dict[str, Any] = {}
    for arm in per_seed:
        if arm == baseline:
            continue
        ratios[arm] = {"time_to_target_ratio": time_ratio(times[baseline], times[arm], level)}
        for name, key in list(TARGET_RATIOS.items())[1:]:  # env steps, tokens: the same seeds count as reached
            base = {s: (per_seed[baseline][s].get(key), r) for s, (_t, r) in times[baseline].items()}
            other = {s: (per_seed[arm][s].get(key), r) for s, (_t, r) in times[arm].items()}
            usable = {s for s in base.keys() & other.keys() if base[s][0] is not None and other[s][0] is not None}
            ratios[arm][name] = time_ratio({s: base[s] for s in usable}, {s: other[s] for s in usable}, level)
    return summary, ratios


def _floors(aa: Mapping[str, Any] | None) -> dict[str, float | None] | None:
    """The A/A comparison's distance from no effect, per figure (None: the study has no A/A arm)."""
    if aa is None:
        return None
    return {name: effect_size(aa.get(name), name in RATIOS) for name in (*RATIOS, *DIFFERENCES)}


def _resolutions(comparisons: Mapping[str, Mapping[str, Any]], floors: Mapping[str, float | None] | None,
                 aa_arm: str | None) -> dict[str, dict[str, str | None]]:
    return {arm: {name: resolution(c.get(name), None if floors is None else floors.get(name), name in RATIOS)
                  for name in (*RATIOS, *DIFFERENCES)}
            for arm, c in comparisons.items() if arm != aa_arm}


def build_report(
    records: Sequence[RunRecord],
    *,
    arms: Sequence[str],
    seeds: Sequence[int],
    baseline: str,
    target: float | None = None,
    stops_at_target: bool = True,
    level: float = 0.95,
    keep_loaded_wall: bool = False,
    aa_arm: str | None = None,
    aa_of: str | None = None,
    screened_out: Mapping[int, str] | None = None,
    order: Mapping[int, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Everything report.json holds; `arms`/`seeds` are the plan (missing runs are listed, not invented).
    `stops_at_target` False: the runs went on to their budget (`run.py ab --to-budget`), the target only read
    off their curves. `aa_arm`: the no-op control arm, a copy of `aa_of` (default the baseline: its floor is its
comparison to that arm, whatever arm the report is against); `screened_out`: seed -> why it was left out before any
    arm ran; `order`: seed -> the order its arms ran in (recorded as given)."""
    screened_out = dict(screened_out or {})
    kept = [r for r in records if r.seed not in screened_out]
    degenerate = degenerate_seeds({s: [_lookup(r.summary, (("learner_updates",),)) for r in kept if r.seed == s]
                                   for s in {r.seed for r in kept}})
    counted = [r for r in kept if r.seed not in degenerate]
    by_arm = {a: [r for r in counted if r.arm == a] for a in arms}
    blocks = {a: _arm_block(rs, target, keep_loaded_wall) for a, rs in by_arm.items()}
    per_seed = {a: {int(s): f for s, f in blocks[a]["per_seed"].items()} for a in arms}
    comparisons = {a: _comparison(per_seed[baseline], per_seed[a], level) for a in arms if a != baseline}
    limit = horizon([f.get("wall_s") for figs in per_seed.values() for f in figs.values()]) if target is not None else None
    target_summary, target_ratios = _target_comparisons(per_seed, baseline, limit, level) if target is not None else ({}, {})
    for arm, extra in target_ratios.items():
        comparisons[arm] |= extra
    aa_of = aa_of or baseline
    aa_comparison = None
    if aa_arm in per_seed and aa_of in per_seed and aa_arm != aa_of:
        aa_comparison = comparisons[aa_arm] if aa_of == baseline else _comparison(per_seed[aa_of], per_seed[aa_arm], level)
    floors = _floors(aa_comparison)
    done = {(r.arm, r.seed) for r in records}
    return {
        "baseline": baseline,
        "aa_arm": aa_arm,
        "aa_of": aa_of if aa_arm else None,
        "aa_comparison": aa_comparison,
        "noise_floor": floors,
        "resolution": _resolutions(comparisons, floors, aa_arm),
        "order": {str(s): list(o) for s, o in (order or {}).items()},
        "machines": machines({(r.arm, r.seed): r.machine for r in records}),
        "commits": {f"{r.arm}-s{r.seed}": r.commit for r in records},
        "screened_out": {str(s): why for s, why in screened_out.items()},
        "degenerate_seeds": degenerate,
        "apart": {f"{r.arm}-s{r.seed}": run_figures(r, target, keep_loaded_wall) for r in kept if r.seed in degenerate},
        "wall_clock": "GRPO phase (summary grpo_wall_s); warm start and before/after evaluation excluded"
                      + ("" if keep_loaded_wall else "; runs on a loaded machine left out"),
        "keep_loaded_wall": keep_loaded_wall,
        "loaded_runs": [{"arm": r.arm, "seed": r.seed} for r in counted if loaded_flag(r.summary)],
        "heldout_range": _ranges(counted, "heldout_range"),
        "curve_range": _ranges(counted, "heldout_curve_range"),
        "stop_rule": ({"kind": "target_heldout", "target": target, "stops": stops_at_target, "horizon_s": limit}
                      if target is not None else {"kind": "trained_groups"}),
        "time_to_target": target_summary,
        "intervals": {"paired_by": "seed", "level": level, "method": "Student-t on per-seed values",
                      "ratios": "geometric mean of per-seed ratios"},
        "arms": blocks,
        "comparisons": comparisons,
        "missing": [{"arm": a, "seed": s} for s in seeds for a in arms if (a, s) not in done and s not in screened_out],
        "notes": _notes(counted, blocks, target, keep_loaded_wall),
    }


def _ranges(records: Sequence[RunRecord], key: str) -> str | None:
    """The task range the runs' figures come from ("dev, test" if they differ; None: no run names one)."""
    names = sorted({str(r.summary[key]) for r in records if r.summary.get(key)})
    return ", ".join(names) if names else None


def _notes(records: Sequence[RunRecord], blocks: Mapping[str, Any], target: float | None, keep_loaded_wall: bool) -> list[str]:
    notes = [load_note(r.arm, r.seed, r.summary, keep_loaded_wall) for r in records if loaded_flag(r.summary)]
    if records and all(loaded_flag(r.summary) is None for r in records):
        notes.append("no run recorded its machine load (summary.json before `load_1m_mean`): a loaded machine cannot be told apart")
    if len({r.summary.get("heldout_range") for r in records}) > 1:
        notes.append("runs measured held-out success on different task ranges: their held-out figures are not comparable")
    if records and not any(r.periodic for r in records):
        notes.append("no periodic held-out rows (`heldout/mean` in metrics.jsonl): eval.every is 0 or this pipeline "
                     "has no periodic evaluation, so each learning curve is its before and after points only")
    absent = [k for k in METRICS if records and all(b.get(k) is None for b in blocks.values() if b["n"])]
    if absent:
        notes.append("no run reported " + ", ".join(f"`{k}`" for k in absent) + " (absent from summary.json, or "
                     "not applicable: gate figures need a shadow gate, cut counts a cutting one)")
    expected = "target_heldout" if target is not None else "updates"
    for r in records:
        reason = r.summary.get("stop_reason")
        if reason not in (expected, "updates"):
            notes.append(f"{r.arm} seed {r.seed} stopped by {reason!r}: it did not train the planned groups, "
                         "so its figures are not comparable at equal work")
    return notes
