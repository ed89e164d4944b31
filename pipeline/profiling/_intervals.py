"""Interval arithmetic on wall-clock spans: union, measure, clipping, and trace-lane assignment.

All functions are pure and take `(t0, t1)` pairs in seconds of the profiler clock. A span with
`t1 < t0` is treated as empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly the points covered by `intervals`.

    Touching intervals (`a.t1 == b.t0`) merge into one; empty intervals vanish.
    """
    merged: list[Interval] = []
    for t0, t1 in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if merged and t0 <= merged[-1][1]:
            if t1 > merged[-1][1]:
                merged[-1] = (merged[-1][0], t1)
        else:
            merged.append((t0, t1))
    return merged


def measure(intervals: Iterable[Interval]) -> float:
    """Total length of the union of `intervals` (overlaps counted once)."""
    return sum(t1 - t0 for t0, t1 in union(intervals))


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    """`intervals` cut to the window `[lo, hi]`; parts outside it are dropped."""
    return [(max(t0, lo), min(t1, hi)) for t0, t1 in intervals if t1 > lo and t0 < hi and hi > lo]


def covered_fraction(intervals: Iterable[Interval], lo: float, hi: float) -> float:
    """Fraction of the window `[lo, hi]` during which at least one interval is open (0 for an empty window)."""
    if hi <= lo:
        return 0.0
    return measure(clip(intervals, lo, hi)) / (hi - lo)


def assign_lanes(spans: Sequence[Interval]) -> list[int]:
    """A lane index per span such that the spans of every lane nest properly (no partial overlaps).

    Chrome/Perfetto draw one thread track as a stack of properly nested slices, so concurrent spans of
    one stage (64 rollout tasks all inside `env_step`) need several tracks. Spans are placed in start
    order (longest first on ties) into the lowest lane that is either empty at the span's start or whose
    innermost open span contains it; so a child stays with its parent whenever no lower lane fits.
    """
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], -spans[i][1]))
    stacks: list[list[float]] = []  # per lane: end times of its open spans, innermost last
    lane_of = [0] * len(spans)
    for i in order:
        t0, t1 = spans[i]
        t1 = max(t0, t1)
        lane = 0
        while lane < len(stacks):
            stack = stacks[lane]
            while stack and stack[-1] <= t0:
                stack.pop()
            if not stack or stack[-1] >= t1:
                break
            lane += 1
        else:
            stacks.append([])
        stacks[lane].append(t1)
        lane_of[i] = lane
    return lane_of
