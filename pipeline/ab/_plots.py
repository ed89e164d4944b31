"""The study's PNG plots via matplotlib's Agg `Figure` (the `plot` extra; skipped with a note without it).

    curves.png          held-out success vs GRPO wall seconds: per arm the mean over seeds (a seed holds its last
                        measurement), shaded min..max, dots at the measurements
    curves_by_seed.png  the same, one panel per seed (two or more seeds): every arm's own curve, where the mean's band
                        would hide a seed unlike the others (one that never learns spans the whole band)
    wall_ratio.png      each arm's wall clock x the baseline's, geometric mean of per-seed ratios with its Student-t interval

and each run's own profile.png, which its run skipped (`profile.plot = false`), drawn from its profile.json.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.profiling import PLOT_FILE, TRACE_FILE, write_plot_from_trace

from ._report import CurvePoint


def step_values(curve: Sequence[CurvePoint], grid: np.ndarray) -> np.ndarray:
    """The last held-out measurement at or before each grid time (NaN before the first) -> [T]."""
    times = np.array([p.wall_s for p in curve])  # [P], sorted
    values = np.array([p.mean for p in curve])  # [P]
    idx = np.searchsorted(times, grid, side="right") - 1  # [T]
    return np.where(idx >= 0, values[np.clip(idx, 0, None)], np.nan)


def _figure() -> Any:
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state
    except ImportError:
        return None
    return Figure


Curves = Mapping[str, Mapping[int, Sequence[CurvePoint]]]  # arm -> seed -> its held-out curve

PLOTS = {  # each plot's file name and what it shows, as report.md names it
    "curves.png": "held-out success vs wall seconds, mean of seeds, band = min..max",
    "curves_by_seed.png": "the same, one panel per seed",
    "wall_ratio.png": "wall clock × baseline with its interval",
}


def write_plots(out_dir: Path, curves: Curves, report: Mapping[str, Any]) -> list[str]:
    """Write the plots; returns the file names written (empty without matplotlib: pip install rollcut[plot])."""
    figure = _figure()
    if figure is None:
        return []
    written = []
    seeds = sorted({s for by_seed in curves.values() for s, c in by_seed.items() if c})  # those with a curve
    if seeds:
        _curves_png(figure, out_dir / "curves.png", curves)
        written.append("curves.png")
    if len(seeds) > 1:
        _curves_by_seed_png(figure, out_dir / "curves_by_seed.png", curves, seeds)
        written.append("curves_by_seed.png")
    if report["comparisons"]:
        _ratio_png(figure, out_dir / "wall_ratio.png", report)
        written.append("wall_ratio.png")
    return written


def write_run_profiles(folders: Sequence[Path]) -> int:
    """Draw profile.png for each run folder that has profile.json and no picture yet (its run had
    `profile.plot = false`, as the harness sets); returns how many were drawn (0 without matplotlib)."""
    drawn = 0
    for folder in folders:
        trace, png = folder / TRACE_FILE, folder / PLOT_FILE
        if trace.is_file() and not png.exists() and write_plot_from_trace(trace, png):
            drawn += 1
    return drawn


def _curves_png(figure: Any, path: Path, curves: Curves) -> None:
    fig = figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    for arm, by_seed in curves.items():
        seeds = [c for c in by_seed.values() if c]
        if not seeds:
            continue
        grid = np.linspace(0.0, max(c[-1].wall_s for c in seeds), 200)  # [T]
        values = np.stack([step_values(c, grid) for c in seeds])  # [S, T]
        (line,) = ax.plot(grid, np.nanmean(values, axis=0), label=f"{arm} (n={len(seeds)})", drawstyle="steps-post")
        if len(seeds) > 1:
            ax.fill_between(grid, np.nanmin(values, axis=0), np.nanmax(values, axis=0), step="post", alpha=0.2, color=line.get_color())
        for c in seeds:  # the measurements themselves
            ax.plot([p.wall_s for p in c], [p.mean for p in c], "o", markersize=3, alpha=0.6, color=line.get_color())
    _success_axes(ax)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110)


def _curves_by_seed_png(figure: Any, path: Path, curves: Curves, seeds: Sequence[int]) -> None:
    cols = min(3, len(seeds))
    rows = -(-len(seeds) // cols)
    fig = figure(figsize=(4.2 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, sharey=True, squeeze=False).ravel()
    colors = {arm: f"C{i}" for i, arm in enumerate(curves)}  # one colour per arm in every panel
    for ax, seed in zip(axes, seeds, strict=False):
        for arm, by_seed in curves.items():
            if c := by_seed.get(seed):
                ax.step([p.wall_s for p in c], [p.mean for p in c], where="post", marker="o", markersize=3,
                        color=colors[arm], label=arm)
        ax.set_title(f"seed {seed}", fontsize="medium")
        _success_axes(ax)
    for ax in axes[len(seeds):]:
        ax.set_axis_off()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), fontsize="small")
    fig.savefig(path, dpi=110)


def _success_axes(ax: Any) -> None:
    ax.set_xlabel("GRPO wall clock (s)")
    ax.set_ylabel("held-out success (seen + unseen)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)


def _ratio_png(figure: Any, path: Path, report: Mapping[str, Any]) -> None:
    rows = [(arm, c["wall_ratio"]) for arm, c in report["comparisons"].items() if c.get("wall_ratio")]
    fig = figure(figsize=(7, 1.2 + 0.45 * max(1, len(rows))), layout="constrained")
    ax = fig.subplots()
    for y, (_arm, r) in enumerate(rows):
        low, high = (r["ci_low"], r["ci_high"]) if r.get("ci_low") is not None else (r["estimate"], r["estimate"])
        ax.errorbar(r["estimate"], y, xerr=[[r["estimate"] - low], [high - r["estimate"]]], fmt="o", capsize=4)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)), [f"{arm} (n={r['n_pairs']})" for arm, r in rows])
    ax.set_xlabel(f"wall clock × {report['baseline']}: geometric mean of per-seed ratios "
                  f"(bars: {report['intervals']['level']:.0%} Student-t interval)")
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, dpi=110)
