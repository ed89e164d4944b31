"""Chrome trace-event JSON (`profile.json`), readable by ui.perfetto.dev and chrome://tracing.

Layout: one process ("rollcut"); one thread track per stage, named after it. A stage whose spans overlap
(concurrent rollout tasks) gets extra tracks "stage #2", "stage #3", ... so every track holds properly
nested complete ("X") events. Waits are X events of category "wait". Process CPU, GPU utilization and
memory, and every `gauge` are counter ("C") tracks. Timestamps are microseconds from the profile start.

`validate_trace` checks the subset of the format we rely on, so tests (and users) can check a file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from numbers import Real
from typing import Any

from ._gpu import GpuTrack
from ._intervals import assign_lanes
from ._recorder import BUSY, SpanRecord

PID = 1


def _us(t: float, lo: float) -> float:
    return round((t - lo) * 1e6, 3)


def build_trace(
    spans: Iterable[SpanRecord],
    *,
    lo: float,
    stages: Sequence[str],
    cpu_samples: Sequence[tuple[float, float, float]] = (),
    gpu_tracks: Sequence[GpuTrack] = (),
    gauges: Sequence[tuple[str, float, float]] = (),
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The trace as a JSON-ready dict; `lo` is the profile start on the profiler clock."""
    by_stage: dict[str, list[SpanRecord]] = {stage: [] for stage in stages}
    for record in spans:
        by_stage.setdefault(record[0], []).append(record)
    meta, events = _span_tracks(by_stage, lo)

    def counter(name: str, t: float, args: dict[str, float]) -> None:
        events.append({"name": name, "ph": "C", "ts": _us(t, lo), "pid": PID, "tid": 0, "args": args})

    for _t0, t1, cores in cpu_samples:
        counter("cpu/process", t1, {"% of one core": round(100.0 * cores, 2)})
    for track in gpu_tracks:
        for _t0, t1, util in track.util:
            counter(f"gpu{track.index}/util", t1, {"%": round(100.0 * util, 2)})
        for t, mib in track.mem_mib:
            counter(f"gpu{track.index}/memory", t, {"MiB": round(mib, 1)})
    for name, t, value in gauges:
        counter(name, t, {"value": value})

    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": dict(metadata or {})}


def _span_tracks(
    by_stage: Mapping[str, Sequence[SpanRecord]], lo: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Thread metadata (one track per stage and overlap lane) and one X event per span."""
    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"name": "rollcut"}},
    ]
    events: list[dict[str, Any]] = []
    tid = 0
    for stage, records in by_stage.items():
        lanes = assign_lanes([(r[3], r[4]) for r in records])
        base = tid + 1
        for lane in range(max(lanes, default=0) + 1):
            tid = base + lane
            label = stage if lane == 0 else f"{stage} #{lane + 1}"
            meta.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": PID, "tid": tid, "args": {"name": label}})
            meta.append(
                {"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": PID, "tid": tid, "args": {"sort_index": tid}}
            )
        for (_stage, name, kind, t0, t1, _c0, _c1), lane in zip(records, lanes, strict=True):
            ts = _us(t0, lo)
            events.append(
                {
                    "name": name or stage,
                    "cat": "busy" if kind == BUSY else "wait",
                    "ph": "X",
                    "ts": ts,
                    "dur": max(_us(t1, lo) - ts, 0.0),
                    "pid": PID,
                    "tid": base + lane,
                }
            )
    return meta, events


def validate_trace(trace: Mapping[str, Any]) -> list[str]:
    """Problems with a trace-event dict (empty list: valid). Checks required keys, per-track monotonic
    timestamps, X durations and nesting, B/E matching, counter args and metadata args."""
    problems: list[str] = []
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["traceEvents is missing or not a list"]
    last_ts: dict[tuple[Any, Any, str], float] = {}
    open_x: dict[tuple[Any, Any], list[float]] = {}
    open_be: dict[tuple[Any, Any], list[str]] = {}
    for i, e in enumerate(events):
        missing = [k for k in ("ph", "ts", "pid", "tid", "name") if k not in e]
        if missing:
            problems.append(f"event {i}: missing {missing}")
            continue
        ph, ts, track = e["ph"], e["ts"], (e["pid"], e["tid"])
        if not isinstance(ts, Real) or ts < 0:
            problems.append(f"event {i}: bad ts {ts!r}")
            continue
        if ph == "M":
            if not isinstance(e.get("args"), dict) or not e["args"]:
                problems.append(f"event {i}: metadata without args")
            continue
        key = (*track, e["name"]) if ph == "C" else (*track, "")
        if ts < last_ts.get(key, float("-inf")):
            problems.append(f"event {i}: ts {ts} goes back on track {key}")
        last_ts[key] = ts
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, Real) or dur < 0:
                problems.append(f"event {i}: bad dur {dur!r}")
                continue
            stack = open_x.setdefault(track, [])
            while stack and stack[-1] <= ts:
                stack.pop()
            if stack and ts + dur > stack[-1] + 1e-6:
                problems.append(f"event {i}: X event overlaps its parent on track {track} without nesting")
            stack.append(ts + dur)
        elif ph == "B":
            open_be.setdefault(track, []).append(e["name"])
        elif ph == "E":
            stack_be = open_be.get(track)
            if not stack_be:
                problems.append(f"event {i}: E without B on track {track}")
            else:
                stack_be.pop()
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args or not all(isinstance(v, Real) for v in args.values()):
                problems.append(f"event {i}: counter needs numeric args")
        else:
            problems.append(f"event {i}: unexpected phase {ph!r}")
    for track, stack_be in open_be.items():
        if stack_be:
            problems.append(f"track {track}: {len(stack_be)} B event(s) never ended")
    return problems


def plot_inputs(trace: Mapping[str, Any]) -> dict[str, Any]:
    """What `build_trace` wrote, read back as `write_plot`'s keyword arguments (times on the trace's clock, in
    seconds from its start, so `lo` = 0): a run that skipped profile.png (`profile.plot = false`, as every run of
    an A/B study does) gets the same picture drawn later from its profile.json. CPU and GPU samples come back
    with the start of each interval at the end of the one before (the trace keeps only the ends)."""
    names: dict[int, str] = {}
    for event in trace.get("traceEvents", ()):
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            names[event["tid"]] = event["args"]["name"]
    stage_of: dict[int, str] = {}
    for tid in sorted(names):
        label = names[tid]
        head, sep, lane = label.rpartition(" #")
        stage_of[tid] = head if sep and lane.isdigit() and head in stage_of.values() else label
    busy: dict[str, list[tuple[float, float]]] = {stage: [] for stage in dict.fromkeys(stage_of.values())}
    waits: dict[str, list[tuple[float, float]]] = {}
    cpu: list[tuple[float, float]] = []
    gpu_util: dict[int, list[tuple[float, float]]] = {}
    gpu_mem: dict[int, list[tuple[float, float]]] = {}
    gauges: list[tuple[str, float, float]] = []
    for event in trace.get("traceEvents", ()):
        t = event.get("ts", 0.0) / 1e6
        if event.get("ph") == "X" and event.get("tid") in stage_of:
            target = busy if event.get("cat") != "wait" else waits
            target.setdefault(stage_of[event["tid"]], []).append((t, t + event.get("dur", 0.0) / 1e6))
        elif event.get("ph") == "C":
            name, args = event["name"], event.get("args", {})
            track, _, what = name.partition("/")
            gpu = int(track[3:]) if track.startswith("gpu") and track[3:].isdigit() else None
            if name == "cpu/process" and "% of one core" in args:
                cpu.append((t, args["% of one core"] / 100.0))
            elif gpu is not None and what == "util" and "%" in args:
                gpu_util.setdefault(gpu, []).append((t, args["%"] / 100.0))
            elif gpu is not None and what == "memory" and "MiB" in args:
                gpu_mem.setdefault(gpu, []).append((t, args["MiB"]))
            elif "value" in args:
                gauges.append((name, t, args["value"]))
    tracks = [GpuTrack(index=i, name=f"gpu{i}", total_mib=0.0, util=_intervals(gpu_util.get(i, [])), mem_mib=gpu_mem.get(i, []))
              for i in sorted(gpu_util.keys() | gpu_mem.keys())]
    return {"lo": 0.0, "busy": busy, "waits": waits, "cpu_samples": _intervals(cpu), "gpu_tracks": tracks, "gauges": gauges}


def _intervals(ends: Sequence[tuple[float, float]]) -> list[tuple[float, float, float]]:
    """(t1, value) samples -> (t0, t1, value), each starting where the one before ended (the first at its own end)."""
    out: list[tuple[float, float, float]] = []
    for t1, value in ends:
        out.append((out[-1][1] if out else t1, t1, value))
    return out
