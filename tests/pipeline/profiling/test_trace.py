import copy

import pytest

from pipeline.profiling import validate_trace
from pipeline.profiling._gpu import GpuTrack
from pipeline.profiling._recorder import BUSY, WAIT
from pipeline.profiling._trace import build_trace, plot_inputs

NAN = float("nan")


def _trace():
    spans = [  # three overlapping rollout spans, one nested, a gate wait
        ("rollout", "env_step", BUSY, 10.0, 10.5, NAN, NAN),
        ("rollout", "env_step", BUSY, 10.2, 10.7, NAN, NAN),
        ("rollout", "parse", BUSY, 10.1, 10.2, NAN, NAN),
        ("gate", "recv", WAIT, 10.0, 11.0, NAN, NAN),
    ]
    gpu = GpuTrack(index=0, name="fake", total_mib=1000.0, util=[(10.0, 10.5, 0.4)], mem_mib=[(10.5, 300.0)])
    return build_trace(
        spans,
        lo=10.0,
        stages=["rollout", "gate"],
        cpu_samples=[(10.0, 10.1, 0.9)],
        gpu_tracks=[gpu],
        gauges=[("queue/policy", 10.3, 12)],
    )


def test_built_trace_is_valid_and_has_one_named_track_per_stage_lane():
    trace = _trace()
    assert validate_trace(trace) == []
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(names.values()) == ["gate", "rollout", "rollout #2"]
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["cat"] for e in xs} == {"busy", "wait"}
    first = next(e for e in xs if e["name"] == "parse")
    assert first["ts"] == pytest.approx(100_000.0)
    assert first["dur"] == pytest.approx(100_000.0)
    counters = {e["name"] for e in trace["traceEvents"] if e["ph"] == "C"}
    assert counters == {"cpu/process", "gpu0/util", "gpu0/memory", "queue/policy"}


def test_the_plots_inputs_read_back_from_the_trace_are_what_built_it():
    """A run with profile.plot = false draws its picture later from profile.json: the same stages in the same
    order (a stage with no span of its kind included), the same spans, samples and gauges, times from the start."""
    got = plot_inputs(_trace())
    assert got["lo"] == 0.0
    assert list(got["busy"]) == ["rollout", "gate"] and got["busy"]["gate"] == []
    assert [pytest.approx(span) for span in [(0.0, 0.5), (0.1, 0.2), (0.2, 0.7)]] == sorted(got["busy"]["rollout"])
    assert got["waits"] == {"gate": [pytest.approx((0.0, 1.0))]}
    assert got["cpu_samples"] == [pytest.approx((0.1, 0.1, 0.9))]  # only the end is kept: it starts there too
    (gpu,) = got["gpu_tracks"]
    assert gpu.index == 0 and gpu.util == [pytest.approx((0.5, 0.5, 0.4))] and gpu.mem_mib == [pytest.approx((0.5, 300.0))]
    assert got["gauges"] == [("queue/policy", pytest.approx(0.3), 12)]


def test_a_stage_named_like_a_lane_is_its_own_stage():
    trace = build_trace([("a #2", "x", BUSY, 0.0, 1.0, NAN, NAN), ("b", "y", BUSY, 0.0, 1.0, NAN, NAN)],
                        lo=0.0, stages=["a #2", "b"])
    assert list(plot_inputs(trace)["busy"]) == ["a #2", "b"]


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda evs: evs[-1].pop("ts"), "missing"),
        (lambda evs: next(e for e in evs if e["ph"] == "X").update(dur=-1), "bad dur"),
        (lambda evs: next(e for e in evs if e["ph"] == "C").update(args={}), "counter"),
        (lambda evs: evs.append({"name": "x", "ph": "B", "ts": 1e9, "pid": 1, "tid": 99}), "never ended"),
        (lambda evs: evs.append({"name": "x", "ph": "E", "ts": 1e9, "pid": 1, "tid": 98}), "E without B"),
    ],
)
def test_validator_catches_broken_traces(mutate, problem):
    trace = copy.deepcopy(_trace())
    mutate(trace["traceEvents"])
    assert any(problem in p for p in validate_trace(trace))


def test_validator_catches_time_going_back_and_partial_overlap():
    events = [
        {"name": "a", "ph": "X", "ts": 5.0, "dur": 10.0, "pid": 1, "tid": 1},
        {"name": "b", "ph": "X", "ts": 6.0, "dur": 10.0, "pid": 1, "tid": 1},  # sticks out of a
        {"name": "c", "ph": "X", "ts": 1.0, "dur": 1.0, "pid": 1, "tid": 1},  # back in time
    ]
    problems = validate_trace({"traceEvents": events})
    assert any("without nesting" in p for p in problems)
    assert any("goes back" in p for p in problems)
