import pytest

from pipeline.profiling import UNATTRIBUTED, active_segments, attribute_samples, attribute_thread_cpu
from pipeline.profiling._attribution import sample_average


def test_segments_track_the_set_of_busy_stages():
    segs = active_segments({"gen": [(0, 4)], "learn": [(2, 6)], "env": [(8, 9), (8.5, 9.5)]})
    assert segs == [(0, 2, ("gen",)), (2, 4, ("gen", "learn")), (4, 6, ("learn",)), (8, 9.5, ("env",))]


def test_single_stage_gets_its_share_and_the_rest_is_unattributed():
    # 80% busy GPU over [0, 1]; the policy is busy for 0.25 s of it.
    out = attribute_samples([(0.0, 1.0, 0.8)], {"policy": [(0.5, 0.75)]})
    assert out["policy"] == pytest.approx(0.2)
    assert out[UNATTRIBUTED] == pytest.approx(0.6)


def test_overlap_is_split_equally_at_each_instant():
    # Sample [0, 4] at 100%: A busy all of it, B busy [2, 4]. [0,2] -> A; [2,4] -> half each.
    out = attribute_samples([(0, 4, 1.0)], {"A": [(0, 4)], "B": [(2, 4)]})
    assert out == {"A": 3.0, "B": 1.0, UNATTRIBUTED: 0.0}


def test_samples_split_at_stage_boundaries_and_conserve_the_total():
    samples = [(0, 1, 0.5), (1, 3, 1.0), (3, 4, 0.0), (4, 6, 0.25)]
    stages = {"gen": [(0.5, 2.0), (4.0, 5.0)], "learn": [(1.5, 3.5)], "idle": []}
    out = attribute_samples(samples, stages)
    # gen: [0.5,1]x0.5 + [1,1.5]x1 + [1.5,2]x1/2 + [4,5]x0.25 = 0.25 + 0.5 + 0.25 + 0.25
    assert out["gen"] == pytest.approx(1.25)
    # learn: [1.5,2]x1/2 + [2,3]x1 + [3,3.5]x0 = 1.25
    assert out["learn"] == pytest.approx(1.25)
    assert out["idle"] == 0.0
    # unattributed: [0,0.5]x0.5 + [5,6]x0.25 = 0.5
    assert out[UNATTRIBUTED] == pytest.approx(0.5)
    assert sum(out.values()) == pytest.approx(sum((t1 - t0) * v for t0, t1, v in samples))


def test_no_samples_attributes_nothing():
    assert attribute_samples([], {"gen": [(0, 1)]}) == {"gen": 0.0, UNATTRIBUTED: 0.0}


def test_thread_cpu_goes_to_open_spans_split_equally_between_stages():
    # (stage, wall t0, wall t1, cpu t0, cpu t1)
    spans = [
        ("rollout", 0.0, 10.0, 0.0, 6.0),
        ("rollout", 1.0, 2.0, 0.5, 1.5),  # nested same stage: counted once
        ("gate", 4.0, 6.0, 3.0, 4.0),  # overlaps rollout: [3, 4] cpu split in two
        ("gate", 12.0, 13.0, 7.0, 7.5),  # alone; [6, 7] between spans is unattributed
    ]
    out = attribute_thread_cpu(spans)
    assert out == pytest.approx({"rollout": 5.5, "gate": 1.0, UNATTRIBUTED: 1.0})


def test_binding_takes_the_thread_cpu_even_inside_spans():
    spans = [("policy", 1.0, 2.0, 1.0, 1.8), ("policy", 5.0, 6.0, 5.0, 5.5)]
    bindings = [("learner", 0.0, 3.0, 0.0, 2.5)]
    out = attribute_thread_cpu(spans, bindings)
    # [0,3] bound -> learner 2.5; [3 (2.5), 5 (5.0)] nothing open -> 2.5 unattributed; last span 0.5
    assert out == pytest.approx({"learner": 2.5, UNATTRIBUTED: 2.5, "policy": 0.5})


def test_cpu_readings_that_go_backwards_are_clamped():
    out = attribute_thread_cpu([("a", 0.0, 1.0, 1.0, 0.9)])
    assert out == {}


def test_sample_average_is_time_weighted():
    assert sample_average([(0, 1, 1.0), (1, 4, 0.0)], 0, 4) == 0.25
    assert sample_average([], 0, 1) == 0.0
