"""Attribution of measured resources (GPU utilization, thread CPU time) to pipeline stages.

Pure functions on plain tuples so the rules are testable with exact numbers.

GPU rule (`attribute_gpu`, per device), in this order:

1. CUDA events: a stage that opened `cuda_span`s gets the CUDA-event time of those spans on the device,
   exactly (rule `RULE_CUDA`), and nothing from NVML.
2. NVML share: each utilization sample's value x length, less the CUDA-event time of the spans that fell
   in it (each span's time spread evenly over its wall interval), floored at 0, is split by the busy
   overlap rule below among the GPU-capable stages that opened no CUDA span (rule `RULE_NVML`).
3. A stage that is not declared GPU-capable gets nothing; NVML time while no eligible stage was busy is
   `UNATTRIBUTED`.

So a CPU-only stage busy beside a stage that runs, and times, all the device's work gets 0, even if it is
declared GPU-capable: the device time its busy overlap would have shared is the timed stage's.

Busy overlap rule (`attribute_samples`): a sample `(t0, t1, value)` says the device ran at `value` (e.g. 0.6 =
60% utilization) over `[t0, t1]`; the value is assumed constant across that interval. At every instant
of the interval the value is shared equally among the stages that are busy at that instant; instants
with no busy stage go to `UNATTRIBUTED`. The result is value x seconds per stage, so summing a stage over
all samples and dividing by wall time gives its average attributed utilization. With no overlapping
stages this is exactly "split in proportion to each stage's busy time within the sample".

CPU rule (`attribute_thread_cpu`): for one thread, the thread's CPU clock is read at every span
boundary. The CPU consumed between two consecutive boundaries goes to the stage the thread is bound to
(`Profiler.bind_thread`) if any; otherwise it is shared equally among the distinct stages with a busy
span open on that thread; otherwise it goes to `UNATTRIBUTED`.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Mapping, Sequence

from ._intervals import Interval, union

UNATTRIBUTED = "(unattributed)"

RULE_CUDA = "cuda events"
"""A stage's GPU number is the CUDA-event time of its `cuda_span`s (exact)."""
RULE_NVML = "nvml share"
"""A stage's GPU number is its busy-overlap share of NVML utilization beyond the timed stages' (an estimate)."""

CudaTime = tuple[str, float, float, float]
"""(stage, wall t0, wall t1, CUDA-event seconds) of one `cuda_span` on one device."""

Sample = tuple[float, float, float]
"""(t0, t1, value): a measurement that holds over [t0, t1]."""

CpuSpan = tuple[str, float, float, float, float]
"""(stage, wall t0, wall t1, thread cpu at t0, thread cpu at t1)."""

Segment = tuple[float, float, tuple[str, ...]]


def active_segments(stage_intervals: Mapping[str, Iterable[Interval]]) -> list[Segment]:
    """Cut the timeline into maximal segments over which the set of busy stages is constant.

    Only segments with at least one busy stage are returned, sorted by time, stages sorted by name.
    """
    edges: list[tuple[float, int, str]] = []
    for stage, intervals in stage_intervals.items():
        for t0, t1 in union(intervals):
            edges.append((t0, 1, stage))
            edges.append((t1, -1, stage))
    edges.sort(key=lambda e: (e[0], e[1]))  # at one instant, ends before starts
    segments: list[Segment] = []
    active: set[str] = set()
    prev = 0.0
    for t, delta, stage in edges:
        if active and t > prev:
            stages = tuple(sorted(active))
            if segments and segments[-1][1] == prev and segments[-1][2] == stages:
                segments[-1] = (segments[-1][0], t, stages)
            else:
                segments.append((prev, t, stages))
        if delta > 0:
            active.add(stage)
        else:
            active.discard(stage)
        prev = t
    return segments


def attribute_samples(
    samples: Iterable[Sample], stage_intervals: Mapping[str, Iterable[Interval]]
) -> dict[str, float]:
    """Split each sample's value x duration among the stages busy during it (see the module rule).

    Returns value-seconds per stage, with `UNATTRIBUTED` for the parts of samples where no stage was busy.
    Every stage of `stage_intervals` appears in the result, with 0.0 if it never overlapped a sample.
    """
    segments = active_segments(stage_intervals)
    out = dict.fromkeys(stage_intervals, 0.0)
    out[UNATTRIBUTED] = 0.0
    first = 0  # segments before this index end before the current sample starts
    for t0, t1, value in sorted(samples):
        if t1 <= t0:
            continue
        while first < len(segments) and segments[first][1] <= t0:
            first += 1
        covered = 0.0
        i = first
        while i < len(segments) and segments[i][0] < t1:
            s0, s1, stages = segments[i]
            overlap = min(s1, t1) - max(s0, t0)
            if overlap > 0:
                covered += overlap
                share = value * overlap / len(stages)
                for stage in stages:
                    out[stage] += share
            i += 1
        out[UNATTRIBUTED] += value * (t1 - t0 - covered)
    return out


def attribute_gpu(
    samples: Iterable[Sample],
    busy: Mapping[str, Iterable[Interval]],
    cuda: Iterable[CudaTime],
    *,
    capable: Collection[str] | None,
    timed: Collection[str] = (),
) -> tuple[dict[str, float], dict[str, str]]:
    """One device's GPU value-seconds per stage, and the rule each stage's number comes from (module rule).

    Args:
        samples: the device's NVML utilization samples (may be empty: then only CUDA-event time counts).
        busy: every stage's busy intervals.
        cuda: the CUDA spans that ran on this device.
        capable: the stages declared GPU-capable (None: every stage with busy intervals).
        timed: stages that opened CUDA spans on any device (they never take an NVML share).

    Returns ({stage: value-seconds, UNATTRIBUTED: ...}, {stage: RULE_CUDA or RULE_NVML}).
    """
    spans = list(cuda)
    timed = set(timed) | {stage for stage, *_ in spans}
    out: dict[str, float] = {UNATTRIBUTED: 0.0}
    rules: dict[str, str] = {}
    for stage, _t0, _t1, seconds in spans:
        out[stage] = out.get(stage, 0.0) + seconds
        rules[stage] = RULE_CUDA
    eligible = {s: v for s, v in busy.items() if s not in timed and (capable is None or s in capable)}
    eligible |= {s: [] for s in (capable or ()) if s not in timed and s not in eligible}
    samples = sorted(samples)
    if samples:
        remaining = [(t0, t1, max(0.0, value - timed_in / (t1 - t0)) if t1 > t0 else 0.0)
                     for (t0, t1, value), timed_in in zip(samples, _cuda_per_sample(samples, spans), strict=True)]
        for stage, value in attribute_samples(remaining, eligible).items():
            out[stage] = out.get(stage, 0.0) + value
        rules |= dict.fromkeys(eligible, RULE_NVML)
    return out, rules


def _cuda_per_sample(samples: Sequence[Sample], spans: Sequence[CudaTime]) -> list[float]:
    """The CUDA-event seconds falling in each (sorted) sample, each span's time spread evenly over its wall
    interval (a span of zero length counts where it starts)."""
    ends = [t1 for _t0, t1, _v in samples]
    out = [0.0] * len(samples)
    for _stage, t0, t1, seconds in spans:
        i = bisect.bisect_right(ends, t0) if t1 > t0 else bisect.bisect_left(ends, t0)
        while i < len(samples) and samples[i][0] <= t1:
            s0, s1, _v = samples[i]
            if t1 > t0:
                out[i] += seconds * max(0.0, min(s1, t1) - max(s0, t0)) / (t1 - t0)
            elif s0 <= t0 <= s1:
                out[i] += seconds
                break
            i += 1
    return out


def attribute_thread_cpu(spans: Iterable[CpuSpan], bindings: Iterable[CpuSpan] = ()) -> dict[str, float]:
    """CPU seconds per stage for ONE thread, from its busy spans and bindings (see the module rule).

    Readings are taken in wall-clock order; a negative CPU delta (two clocks of different resolution) is
    clamped to zero. CPU before the first or after the last boundary is unknown and not counted.
    """
    # (wall t, cpu, kind, stage); kind 0 span end, 1 binding end, 2 binding start, 3 span start, so that
    # at one instant everything that closes is handled before anything that opens.
    events: list[tuple[float, float, int, str]] = []
    for stage, t0, t1, c0, c1 in spans:
        events.append((t0, c0, 3, stage))
        events.append((t1, c1, 0, stage))
    for stage, t0, t1, c0, c1 in bindings:
        events.append((t0, c0, 2, stage))
        events.append((t1, c1, 1, stage))
    events.sort(key=lambda e: (e[0], e[2]))
    out: dict[str, float] = {}
    open_spans: dict[str, int] = {}
    bound: list[str] = []
    last_cpu: float | None = None
    for _t, cpu, kind, stage in events:
        if last_cpu is not None and cpu > last_cpu:
            delta = cpu - last_cpu
            if bound:
                out[bound[-1]] = out.get(bound[-1], 0.0) + delta
            elif open_spans:
                share = delta / len(open_spans)
                for s in open_spans:
                    out[s] = out.get(s, 0.0) + share
            else:
                out[UNATTRIBUTED] = out.get(UNATTRIBUTED, 0.0) + delta
        if last_cpu is None or cpu > last_cpu:
            last_cpu = cpu
        if kind == 3:
            open_spans[stage] = open_spans.get(stage, 0) + 1
        elif kind == 0:
            left = open_spans.get(stage, 0) - 1
            if left > 0:
                open_spans[stage] = left
            else:
                open_spans.pop(stage, None)
        elif kind == 2:
            bound.append(stage)
        elif stage in bound:
            bound.remove(stage)
    return out


def sample_average(samples: Sequence[Sample], lo: float, hi: float) -> float:
    """Time-weighted mean of sample values over `[lo, hi]` (parts of samples outside it are ignored)."""
    total = covered = 0.0
    for t0, t1, value in samples:
        overlap = min(t1, hi) - max(t0, lo)
        if overlap > 0:
            total += value * overlap
            covered += overlap
    return total / covered if covered > 0 else 0.0
