from hypothesis import given
from hypothesis import strategies as st

from pipeline.profiling import assign_lanes, covered_fraction, measure, union
from pipeline.profiling._intervals import clip


def test_union_merges_overlapping_and_touching_and_drops_empty():
    assert union([(3, 4), (0, 1), (0.5, 2), (2, 2.5), (5, 5), (6, 5)]) == [(0, 2.5), (3, 4)]


def test_measure_counts_overlap_once():
    # 64 concurrent tasks inside the same second still make one busy second.
    assert measure([(0.0, 1.0)] * 64) == 1.0
    assert measure([(0, 2), (1, 3), (10, 11)]) == 4


def test_covered_fraction_clips_to_window():
    assert covered_fraction([(-5, 1), (3, 20)], 0, 10) == 0.8
    assert covered_fraction([(0, 1)], 5, 5) == 0.0
    assert clip([(0, 1), (2, 3)], 0.5, 2.5) == [(0.5, 1), (2, 2.5)]


def _check_lanes(spans, lanes):
    by_lane = {}
    for (t0, t1), lane in zip(spans, lanes, strict=True):
        by_lane.setdefault(lane, []).append((t0, max(t0, t1)))
    for items in by_lane.values():
        stack = []
        for t0, t1 in sorted(items, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= t0:
                stack.pop()
            assert not stack or t1 <= stack[-1], f"{(t0, t1)} partially overlaps its lane"
            stack.append(t1)


def test_lanes_nest_children_and_spread_concurrent_spans():
    spans = [(0, 10), (1, 2), (3, 4), (1.5, 12), (11, 13)]
    lanes = assign_lanes(spans)
    _check_lanes(spans, lanes)
    assert lanes == [0, 0, 0, 1, 0]  # children with their parent; (1.5, 12) overlaps it; (11, 13) reuses 0


def test_sequential_spans_share_one_lane_and_concurrent_ones_do_not():
    assert assign_lanes([(i, i + 1) for i in range(5)]) == [0] * 5
    assert sorted(assign_lanes([(0, 2 + i / 10) for i in range(3)] + [(1, 5)])) == [0, 0, 0, 1]


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), max_size=60))
def test_lanes_always_nest_properly(raw):
    spans = [(float(a), float(a + d)) for a, d in raw]
    _check_lanes(spans, assign_lanes(spans))
