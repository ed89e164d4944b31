"""`profile.png`: stage timeline (busy and wait) over utilization and gauge tracks, via matplotlib Agg."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog

from ._gpu import GpuTrack
from ._intervals import Interval, union
from ._trace import plot_inputs

log = structlog.get_logger(__name__)


def write_plot(
    path: Path,
    *,
    lo: float,
    busy: Mapping[str, Sequence[Interval]],
    waits: Mapping[str, Sequence[Interval]],
    cpu_samples: Sequence[tuple[float, float, float]],
    gpu_tracks: Sequence[GpuTrack],
    gauges: Sequence[tuple[str, float, float]],
) -> bool:
    """Draw the plot; returns False (with a logged note) when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, safe off the main thread
    except ImportError:
        log.info("profile_plot_skipped", reason="matplotlib not installed (pip install rollcut[plot])")
        return False

    stages = list(dict.fromkeys([*busy, *waits]))
    gauge_names = list(dict.fromkeys(name for name, _t, _v in gauges))
    n_axes = 2 + (1 if gauge_names else 0)
    fig = Figure(figsize=(11, 2.2 + 0.35 * len(stages) + 2.2 * (n_axes - 1)), layout="constrained")
    axes = fig.subplots(
        n_axes,
        1,
        sharex=True,
        squeeze=False,
        height_ratios=[max(1.5, 0.35 * len(stages))] + [1.5] * (n_axes - 1),
    )[:, 0]
    _timeline(axes[0], stages, lo, busy, waits)
    _utilization(axes[1], lo, cpu_samples, gpu_tracks)
    if gauge_names:
        ax = axes[2]
        for name in gauge_names:
            points = [(t - lo, v) for n, t, v in gauges if n == name]
            ax.step([t for t, _v in points], [v for _t, v in points], where="post", label=name)
        ax.legend(loc="upper left", fontsize=8)
        ax.set_ylabel("gauge")
    axes[-1].set_xlabel("seconds since profile start")
    fig.savefig(path, dpi=110)
    return True


def write_plot_from_trace(trace_file: Path, path: Path) -> bool:
    """Draw `path` from a run's profile.json (`Profiler.write(..., plot=False)` left the picture for later: an A/B
    study draws every run's at its end, in one process, instead of importing matplotlib in each run)."""
    return write_plot(path, **plot_inputs(msgspec.json.decode(trace_file.read_bytes())))


def _timeline(
    timeline: Any, stages: list[str], lo: float, busy: Mapping[str, Sequence[Interval]], waits: Mapping[str, Sequence[Interval]]
) -> None:
    """One row per stage: its busy intervals in colour over its wait intervals in grey."""
    for row, stage in enumerate(stages):
        y = len(stages) - 1 - row
        spans = [(t0 - lo, t1 - t0) for t0, t1 in union(waits.get(stage, ()))]
        timeline.broken_barh(spans, (y - 0.35, 0.7), facecolors="#d0d0d0", label="wait" if row == 0 else None)
        spans = [(t0 - lo, t1 - t0) for t0, t1 in union(busy.get(stage, ()))]
        timeline.broken_barh(spans, (y - 0.35, 0.7), facecolors=f"C{row % 10}")
    timeline.set_yticks(range(len(stages)), list(reversed(stages)))
    timeline.set_title("busy (colour) and wait (grey) per stage")


def _utilization(util: Any, lo: float, cpu_samples: Sequence[tuple[float, float, float]], gpu_tracks: Sequence[GpuTrack]) -> None:
    """Process CPU and each GPU's utilization over time, in percent."""
    if cpu_samples:
        util.step(
            [t1 - lo for _t0, t1, _v in cpu_samples],
            [100 * v for *_t, v in cpu_samples],
            where="pre",
            label="process CPU (% of one core)",
        )
    for track in gpu_tracks:
        util.step(
            [t1 - lo for _t0, t1, _v in track.util],
            [100 * v for *_t, v in track.util],
            where="pre",
            label=f"GPU {track.index} util %",
        )
    if not gpu_tracks:
        util.text(0.99, 0.95, "GPU: n/a (no GPU)", transform=util.transAxes, ha="right", va="top", fontsize=8)
    util.set_ylabel("%")
    if cpu_samples or gpu_tracks:
        util.legend(loc="upper left", fontsize=8)
