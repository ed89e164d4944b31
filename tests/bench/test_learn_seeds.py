"""bench/learn_seeds.py's table: per-seed rows from summary.json and the mean rise over seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import bench_module


@pytest.fixture(scope="module")
def learn_seeds():
    return bench_module("learn_seeds")


def _run_folder(tmp_path: Path, seed: int, before: tuple[float, float], after: tuple[float, float]) -> Path:
    folder = tmp_path / f"learn-s{seed}"
    folder.mkdir()
    summary = {
        "seed": seed,
        "heldout_before": {"heldout_seen": before[0], "heldout_unseen": before[1]},
        "heldout_after": {"heldout_seen": after[0], "heldout_unseen": after[1]},
        "heldout_success_before": sum(before) / 2,
        "heldout_success_after": sum(after) / 2,
        "heldout_tasks_per_split": 200,
        "wall_s": 1700.4,
        "grpo_wall_s": 1500.2,
        "env_steps": 1000 + seed,
        "learner_updates": 40,
        "heldout_curve": [{"iteration": 8, "heldout/mean": sum(after) / 2 + 0.01}] if seed == 0 else [],
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_report_gives_a_row_per_seed_and_the_mean_rise(learn_seeds, tmp_path: Path) -> None:
    folders = [
        _run_folder(tmp_path, 0, (0.20, 0.18), (0.32, 0.30)),  # +12 points
        _run_folder(tmp_path, 1, (0.22, 0.12), (0.30, 0.24)),  # +10 points
        _run_folder(tmp_path, 2, (0.20, 0.20), (0.26, 0.26)),  # +6 points
    ]
    text = learn_seeds.report(folders)
    assert "| 0 | 20.0 → 32.0 | 18.0 → 30.0 | 19.0 → 31.0 | 12.0 | 8: 32.0 | 1700 | 1500 | 1000 | 40 |" in text
    assert "| 2 | 20.0 → 26.0 | 20.0 → 26.0 | 20.0 → 26.0 | 6.0 | none |" in text
    assert "Mean rise over seeds [0, 1, 2]: +9.3 pp (range over 3 seeds: [+6.0, +12.0])" in text
    assert "95" not in text and "bootstrap" not in text  # three seeds give a range, never a 95 % interval


def test_five_seeds_get_a_paired_bootstrap_interval_with_its_n(learn_seeds, tmp_path: Path) -> None:
    rises = [(0.20, 0.30), (0.22, 0.30), (0.20, 0.26), (0.18, 0.30), (0.25, 0.29)]
    text = learn_seeds.report([_run_folder(tmp_path, s, (b, b), (a, a)) for s, (b, a) in enumerate(rises)])
    assert "(95 % paired bootstrap interval, n = 5: [" in text
    low, high = text.split("n = 5: [")[1].split("]")[0].split(", ")
    assert 4.0 <= float(low) <= float(high) <= 12.0
