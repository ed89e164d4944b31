"""bench/run_cpu.py: CPU per env step and per update from a run's profile table and summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import bench_module


@pytest.fixture(scope="module")
def run_cpu():
    return bench_module("run_cpu")


def _run(folder: Path, env_steps: int, updates: int, policy_pct: float, learner_pct: float | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"env_steps": env_steps, "learner_updates": updates, "load_1m_mean": 2.5}))
    rows = [{"stage": "policy", "cpu_pct": policy_pct}] + ([{"stage": "learner", "cpu_pct": learner_pct}] if learner_pct is not None else [])
    (folder / "profile_table.json").write_text(json.dumps({"wall_s": 200.0, "process_cpu_pct": 190.0, "rows": rows}))
    return folder


def test_cpu_per_env_step_and_per_update(run_cpu, tmp_path: Path) -> None:
    folder = _run(tmp_path / "a-s1", env_steps=40_000, updates=20, policy_pct=120.0, learner_pct=50.0)
    figures = run_cpu.cpu_figures(json.loads((folder / "summary.json").read_text()),
                                  json.loads((folder / "profile_table.json").read_text()))
    assert figures["policy_cpu_ms_per_env_step"] == pytest.approx(1000 * 1.2 * 200 / 40_000)  # 6 ms
    assert figures["learner_cpu_s_per_update"] == pytest.approx(0.5 * 200 / 20)
    assert figures["process_cpu_pct"] == 190.0 and figures["load_1m_mean"] == 2.5


def test_a_study_folder_lists_its_runs_and_leaves_set_aside_ones_out(run_cpu, tmp_path: Path, capsys) -> None:
    _run(tmp_path / "ab" / "async-grpo-s1", 40_000, 20, 120.0, 50.0)
    _run(tmp_path / "ab" / "async-grpo-s1.loaded-1", 40_000, 20, 60.0, 25.0)
    _run(tmp_path / "ab" / "sync-grpo-s1", 20_000, 0, 100.0, None)  # no update, no learner row: "-", not a division by 0
    (tmp_path / "ab" / "logs").mkdir()
    assert run_cpu.main([str(tmp_path / "ab")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["async-grpo-s1", "sync-grpo-s1"]
    assert "| 6.00 | 5.00 |" in lines[2] and "| 10.00 | - |" in lines[3]


def test_no_run_is_exit_2(run_cpu, tmp_path: Path, capsys) -> None:
    assert run_cpu.main([str(tmp_path)]) == 2
    assert run_cpu.main([str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
