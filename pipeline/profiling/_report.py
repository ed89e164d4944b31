"""The per-stage table: rows computed from a snapshot, rendered as Markdown, saved and loaded as JSON.

Columns (all over the profiled window, `wall_s` long):

- busy %: fraction of wall time during which at least one busy span of the stage was open (the union of
  its spans, so 64 rollout tasks stepping at once still count at most 100%).
- CPU %: CPU seconds attributed to the stage / wall seconds, in units of one core. A stage whose work runs
  on several threads can exceed 100%.
- GPU %: average device utilization attributed to the stage (see `_attribution`), in units of one
  device; "n/a (no GPU)" when no GPU was sampled, "-" for a stage excluded from GPU attribution.
- items/s: `Profiler.items` count / wall seconds.
- p50 / p99 ms: from `Profiler.latency` samples when the stage has any, else from its busy span durations.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec
import numpy as np

from ._attribution import UNATTRIBUTED
from ._intervals import covered_fraction
from ._recorder import BUSY, WAIT, Snapshot

TABLE_FILE = "profile_table.json"


class StageRow(msgspec.Struct, frozen=True, kw_only=True):
    stage: str
    busy_pct: float | None
    """None for the unattributed row."""
    wait_pct: float | None
    cpu_pct: float
    gpu_pct: float | None
    """None when there is no GPU number for this row (no GPU, or the stage is excluded)."""
    items: int = 0
    items_per_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    latency_from: str = ""
    """"latency" (explicit samples), "spans" (busy span durations) or "" (none)."""
    spans: int = 0
    cuda_ms: float | None = None
    """Total CUDA-event time of the stage's `cuda_span`s, when any ran on a GPU."""
    gpu_from: str = ""
    """The rule behind `gpu_pct` (`_attribution`): "cuda events" (exact), "nvml share" (an estimate), or ""."""


class Report(msgspec.Struct, frozen=True, kw_only=True):
    wall_s: float
    process_cpu_pct: float | None
    gpu_status: str
    gpu_available: bool
    gpu_mean_util_pct: list[float] = []
    """Per device, the plain (unattributed) mean utilization over the window."""
    rows: list[StageRow] = []
    spans: int = 0
    dropped_spans: int = 0

    def row(self, stage: str) -> StageRow:
        for r in self.rows:
            if r.stage == stage:
                return r
        raise KeyError(stage)

    def table_markdown(self) -> str:
        """The per-stage table plus a short footer, as GitHub Markdown."""
        no_gpu = "n/a (no GPU)" if not self.gpu_available else "-"
        lines = [
            "| stage | busy % | CPU % | GPU % attributed | items/s | p50 ms | p99 ms |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            lines.append(
                f"| {r.stage} | {_pct(r.busy_pct)} | {_pct(r.cpu_pct)} | "
                f"{_gpu_cell(r) if r.gpu_pct is not None else no_gpu} | "
                f"{_num(r.items_per_s) if r.items else '-'} | {_num(r.p50_ms)} | {_num(r.p99_ms)} |"
            )
        cpu = _pct(self.process_cpu_pct)
        gpu = ", ".join(f"{u:.1f}%" for u in self.gpu_mean_util_pct)
        lines.append("")
        lines.append(
            f"Window {self.wall_s:.2f} s, {self.spans} spans"
            + (f" ({self.dropped_spans} dropped at the per-thread cap)" if self.dropped_spans else "")
            + f"; process CPU {cpu} (of one core); GPU: {self.gpu_status}"
            + (f", mean utilization {gpu}" if gpu else "")
            + "."
        )
        return "\n".join(lines) + "\n"

    def to_json(self) -> bytes:
        return msgspec.json.format(msgspec.json.encode(self), indent=2)


def _gpu_cell(row: StageRow) -> str:
    """The GPU % with the rule it comes from: "(events)" exact CUDA-event time, "(NVML)" a utilization share."""
    tag = {"cuda events": " (events)", "nvml share": " (NVML)"}.get(row.gpu_from, "")
    return _pct(row.gpu_pct) + tag


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def load_report(run_dir: str | Path) -> Report:
    """Read `run_dir/profile_table.json` written by `Profiler.write`."""
    return msgspec.json.decode(Path(run_dir, TABLE_FILE).read_bytes(), type=Report)


def build_report(
    snap: Snapshot,
    *,
    window: tuple[float, float],
    cpu_by_stage: Mapping[str, float],
    process_cpu_s: float | None,
    gpu_by_stage: Mapping[str, float] | None,
    gpu_status: str,
    gpu_mean_util: list[float],
    cuda_s: Mapping[str, float],
    gpu_rules: Mapping[str, str] | None = None,
) -> Report:
    """Assemble the rows. `cpu_by_stage` is CPU seconds, `gpu_by_stage` utilization x seconds summed over
    devices (None when no GPU was sampled); both may hold `UNATTRIBUTED`."""
    lo, hi = window
    wall = max(hi - lo, 1e-12)
    busy, waits, durations, latencies = _by_stage(snap)
    rows = []
    for stage in snap.stages():
        samples, source = latencies.get(stage), "latency"
        if not samples:
            samples, source = durations.get(stage), "spans"
        p50 = p99 = None
        if samples:
            p50, p99 = (float(v) * 1000.0 for v in np.percentile(samples, [50, 99]))
        gpu = None
        if gpu_by_stage is not None and stage in gpu_by_stage:
            gpu = 100.0 * gpu_by_stage[stage] / wall
        items = snap.items.get(stage, 0)
        rows.append(
            StageRow(
                stage=stage,
                busy_pct=100.0 * covered_fraction(busy.get(stage, []), lo, hi),
                wait_pct=100.0 * covered_fraction(waits.get(stage, []), lo, hi),
                cpu_pct=100.0 * cpu_by_stage.get(stage, 0.0) / wall,
                gpu_pct=gpu,
                items=items,
                items_per_s=items / wall,
                p50_ms=p50,
                p99_ms=p99,
                latency_from=source if samples else "",
                spans=len(durations.get(stage, [])),
                cuda_ms=1000.0 * cuda_s[stage] if stage in cuda_s else None,
                gpu_from=(gpu_rules or {}).get(stage, "") if gpu is not None else "",
            )
        )
    rows.append(_unattributed_row(wall, cpu_by_stage, process_cpu_s, gpu_by_stage))
    return Report(
        wall_s=hi - lo,
        process_cpu_pct=100.0 * process_cpu_s / wall if process_cpu_s is not None else None,
        gpu_status=gpu_status,
        gpu_available=gpu_by_stage is not None,
        gpu_mean_util_pct=[100.0 * u for u in gpu_mean_util],
        rows=rows,
        spans=len(snap.spans),
        dropped_spans=snap.dropped,
    )


Intervals = dict[str, list[tuple[float, float]]]


def _by_stage(snap: Snapshot) -> tuple[Intervals, Intervals, dict[str, list[float]], dict[str, list[float]]]:
    """Per stage: busy intervals, wait intervals, busy span durations, recorded latencies (seconds)."""
    busy: Intervals = {}
    waits: Intervals = {}
    durations: dict[str, list[float]] = {}
    for (stage, _name, kind, t0, t1, _c0, _c1), _thread in snap.spans:
        if kind == BUSY:
            busy.setdefault(stage, []).append((t0, t1))
            durations.setdefault(stage, []).append(t1 - t0)
        elif kind == WAIT:
            waits.setdefault(stage, []).append((t0, t1))
    latencies: dict[str, list[float]] = {}
    for stage, _name, seconds in snap.latencies:
        latencies.setdefault(stage, []).append(seconds)
    return busy, waits, durations, latencies


def _unattributed_row(
    wall: float, cpu_by_stage: Mapping[str, float], process_cpu_s: float | None, gpu_by_stage: Mapping[str, float] | None
) -> StageRow:
    """What no stage claimed: CPU of unbound threads or outside spans, GPU time with no busy stage."""
    attributed_cpu = sum(v for k, v in cpu_by_stage.items() if k != UNATTRIBUTED)
    rest_cpu = (
        (process_cpu_s - attributed_cpu) if process_cpu_s is not None else cpu_by_stage.get(UNATTRIBUTED, 0)
    )
    return StageRow(
        stage=UNATTRIBUTED,
        busy_pct=None,
        wait_pct=None,
        cpu_pct=100.0 * max(rest_cpu, 0.0) / wall,
        gpu_pct=100.0 * gpu_by_stage.get(UNATTRIBUTED, 0.0) / wall if gpu_by_stage is not None else None,
    )
