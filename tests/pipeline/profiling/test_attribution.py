import pytest

from pipeline.profiling import (
    RULE_CUDA,
    RULE_NVML,
    UNATTRIBUTED,
    active_segments,
    attribute_gpu,
    attribute_samples,
    attribute_thread_cpu,
)
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


# ---- the GPU rule: CUDA-event time where stages time their work, NVML only for the others ----------------


def test_the_issue_probe_a_timed_learner_takes_the_device_and_the_idle_rollout_gets_nothing():
    # The probe of issue 39: only the learner ran CUDA work (97 % busy while it ran), timed by its CUDA spans;
    # rollout (CPU only) was busy at the same time and declared GPU-capable. Busy overlap alone gave rollout
    # a share of the device; with the learner's events it gets 0.
    samples = [(0.0, 1.0, 0.97), (1.0, 2.0, 0.97)]
    busy = {"learner": [(0.0, 2.0)], "rollout": [(0.0, 2.0)]}
    cuda = [("learner", 0.0, 1.0, 0.97), ("learner", 1.0, 2.0, 0.97)]
    out, rules = attribute_gpu(samples, busy, cuda, capable={"learner", "rollout"})
    assert out == {UNATTRIBUTED: 0.0, "learner": pytest.approx(1.94), "rollout": 0.0}
    assert rules == {"learner": RULE_CUDA, "rollout": RULE_NVML}
    share, _ = attribute_gpu(samples, busy, [], capable={"learner", "rollout"})  # without the events: split by overlap
    assert share["rollout"] == pytest.approx(0.97)


def test_nvml_beyond_the_timed_work_goes_to_the_untimed_capable_stage_busy_then():
    # Device at 100 % over [0, 4]. The learner's span [0, 2] timed 1.5 s of kernels; policy (no spans, its
    # work in decoding processes) is busy [0, 4]; env is busy too but not GPU-capable.
    samples = [(0.0, 2.0, 1.0), (2.0, 4.0, 1.0)]
    busy = {"learner": [(0.0, 2.0)], "policy": [(0.0, 4.0)], "env": [(0.0, 4.0)]}
    out, rules = attribute_gpu(samples, busy, [("learner", 0.0, 2.0, 1.5)], capable={"learner", "policy"})
    assert out["learner"] == pytest.approx(1.5)  # exact, whatever NVML said
    assert out["policy"] == pytest.approx(0.5 + 2.0)  # [0, 2]: 2 - 1.5 left; [2, 4]: all of it
    assert "env" not in out and "env" not in rules  # never a stage that is not GPU-capable
    assert out[UNATTRIBUTED] == 0.0
    assert rules == {"learner": RULE_CUDA, "policy": RULE_NVML}


def test_timed_work_above_nvml_leaves_nothing_to_share_and_a_span_is_spread_over_its_samples():
    samples = [(0.0, 1.0, 0.5), (1.0, 2.0, 0.5), (2.0, 3.0, 0.5)]
    busy = {"learner": [(0.5, 2.5)], "policy": [(0.0, 3.0)]}
    # 1.6 s of events over [0.5, 2.5]: 0.4 in [0, 1], 0.8 in [1, 2], 0.4 in [2, 3]
    out, _ = attribute_gpu(samples, busy, [("learner", 0.5, 2.5, 1.6)], capable=None)
    assert out["learner"] == pytest.approx(1.6)
    assert out["policy"] == pytest.approx(0.1 + 0.0 + 0.1)  # 0.5 - 0.4, max(0, 0.5 - 0.8), 0.5 - 0.4
    assert out[UNATTRIBUTED] == 0.0


def test_without_nvml_samples_only_the_timed_stages_have_a_number():
    out, rules = attribute_gpu([], {"learner": [(0, 1)], "policy": [(0, 1)]}, [("learner", 0.0, 1.0, 0.25)], capable=None)
    assert out == {UNATTRIBUTED: 0.0, "learner": 0.25}
    assert rules == {"learner": RULE_CUDA}


def test_a_stage_timed_on_another_device_takes_no_nvml_share_here():
    out, rules = attribute_gpu([(0.0, 1.0, 1.0)], {"learner": [(0, 1)], "policy": [(0, 1)]}, [], capable=None, timed={"learner"})
    assert out == {UNATTRIBUTED: 0.0, "policy": 1.0}
    assert rules == {"policy": RULE_NVML}
