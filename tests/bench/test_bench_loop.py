"""bench/bench_loop.py: its arms parse, and its table reads each arm's summary and its ratio to the first."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

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


def test_the_before_arm_undoes_what_the_default_run_sets_for_the_loop_and_the_after_arm_is_the_default() -> None:
    from pipeline.config import load_config

    bench, default = _bench(), Path(__file__).resolve().parents[2] / "configs" / "default.toml"
    before, after = (load_config(str(default), bench.DEFAULT_ARMS[arm]) for arm in ("before", "after"))
    assert (before.run.gc_freeze, before.run.gil_switch_ms, before.learner.trim_memory) == (False, 0, False)
    assert before.policy.worker_nice == before.learner.thread_nice == 0 and before.learner.micro_batch == 64
    assert after.run.gc_freeze and after.run.gil_switch_ms > 0 and after.learner.trim_memory
    assert after.policy.worker_nice == after.learner.thread_nice == 19  # configs/default.toml: below the loop
    assert after.learner.micro_batch == 16


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


def test_only_keeps_the_named_arms_in_order_and_an_unknown_one_is_refused() -> None:
    bench = _bench()
    added = [bench.parse_arm("micro16=learner.micro_batch=16")]
    assert bench.selected_arms(added, None) == {**bench.DEFAULT_ARMS, "micro16": ["learner.micro_batch=16"]}
    assert bench.selected_arms(added, "micro16,after") == {"micro16": ["learner.micro_batch=16"], "after": []}
    with pytest.raises(argparse.ArgumentTypeError, match="unknown arm"):
        bench.selected_arms([], "after,nope")


def test_one_at_a_time_starts_each_arm_after_the_last_one_ended(monkeypatch, capsys) -> None:
    """--one-at-a-time: each arm's run has the machine to itself (side by side, every arm starts before any ends)."""
    bench = _bench()
    events: list[str] = []

    class FakeRun:
        def __init__(self, command, **kwargs):
            self.name = json.loads(command[command.index("--set", len(command) - 4) + 1].split("=", 1)[1])
            self.out = Path(command[command.index("--out") + 1])
            self.returncode = 0
            events.append(f"start {self.name}")

        def communicate(self):
            (self.out / self.name).mkdir(parents=True)
            (self.out / self.name / "summary.json").write_text(json.dumps({"loop_lag_p99_ms": 2.0, "peak_rss_mb": 900.0,
                "loop_blockers": [{"name": "(wake-up)", "count": 3, "total_ms": 9.0, "longest_ms": 4.0}]}))
            events.append(f"end {self.name}")
            return "", ""

    monkeypatch.setattr(bench.subprocess, "Popen", FakeRun)
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0))
    assert bench.main(["--one-at-a-time"]) == 0
    assert events == ["start before", "end before", "start after", "end after"]
    out = capsys.readouterr().out
    assert "one at a time" in out and "after: what held the loop" in out and "(wake-up) 3 9 4.0" in out
    events.clear()
    assert bench.main(["--only", "after"]) == 0
    assert events == ["start after", "end after"]
