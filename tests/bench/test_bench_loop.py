"""bench/bench_loop.py: its arms parse, and its table reads each arm's summary and its ratio to the first."""

from __future__ import annotations

import argparse

import pytest

from . import bench_module


def _bench():
    return bench_module("bench_loop")


def test_an_arm_is_a_name_and_its_settings() -> None:
    bench = _bench()
    assert bench.parse_arm("micro16=learner.micro_batch=16,run.flat_memory=true") == (
        "micro16", ["learner.micro_batch=16", "run.flat_memory=true"])
    assert bench.parse_arm("plain=") == ("plain", [])
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_arm("=run.gc_freeze=false")
    assert bench.DEFAULT_ARMS == {"before": ["run.gc_freeze=false", "run.gil_switch_ms=0", "learner.trim_memory=false"], "after": []}


def test_the_table_gives_each_figure_and_its_ratio_to_the_first_arm() -> None:
    bench = _bench()
    before = bench.figures({"loop_lag_p99_ms": 14.0, "peak_rss_mb": 2800.0, "env_steps": 1000, "grpo_wall_s": 10.0})
    after = bench.figures({"loop_lag_p99_ms": 3.5, "peak_rss_mb": 1400.0, "env_steps": 990, "grpo_wall_s": 10.0})
    assert after == {"loop_lag_p99_ms": 3.5, "peak_rss_mb": 1400.0, "env_steps_per_s": 99.0}
    lines = bench.table({"before": before, "after": after})
    assert lines[0].startswith("before") and "(1.00x)" in lines[0]
    assert "loop_lag_p99_ms 3.5 (0.25x)" in lines[1] and "peak_rss_mb 1400.0 (0.50x)" in lines[1]
    assert "env_steps_per_s 99.0 (0.99x)" in lines[1]
    assert "n/a" in bench.table({"a": bench.figures({}), "b": after})[0]
