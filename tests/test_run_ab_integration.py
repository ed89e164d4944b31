"""`run.py ab` on the tiny budget, real pipeline: two arms x one seed, then the report's structure
(not its numbers: the tiny policy's figures mean nothing) and `ab report` rebuilding it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ab_tiny_writes_the_report(tmp_path):
    args = [sys.executable, "run.py", "ab", "--arms", "gate,async-grpo", "--seeds", "0", "--budget", "tiny",
            "--out", str(tmp_path / "runs"), "--set", f'policy.cache_dir="{tmp_path / "cache"}"']
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ab_dir = tmp_path / "runs" / "ab-tiny" / "ab"
    report = json.loads((ab_dir / "report.json").read_text())

    assert report["baseline"] == "gate"
    loaded = {(r["arm"], r["seed"]) for r in report["loaded_runs"]}
    for arm in ("gate", "async-grpo"):
        block = report["arms"][arm]
        assert block["seeds"] == [0]
        for key in ("env_steps", "groups_cut", "groups_trained", "heldout_success_after"):
            assert isinstance(block[key], int | float), (arm, key)
        # A run the machine's load flagged keeps its env steps but not its wall clock (CI's stress pass loads it).
        assert (block["wall_s"] is None) == ((arm, 0) in loaded), (arm, block["wall_s"], loaded)
        assert (ab_dir / f"{arm}-s0" / "summary.json").exists()
    ratio = report["comparisons"]["async-grpo"]["wall_ratio"]
    if loaded:
        assert ratio is None
    else:
        assert ratio["ci_low"] <= ratio["estimate"] <= ratio["ci_high"] and ratio["seeds"] == [0]
    assert report["missing"] == []
    assert {"report.md", "curves.png", "wall_ratio.png"} <= {p.name for p in ab_dir.iterdir()}

    kept = subprocess.run([sys.executable, "run.py", "ab", "report", str(ab_dir.parent), "--keep-loaded-wall"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert kept.returncode == 0, kept.stderr
    kept_report = json.loads((ab_dir / "report.json").read_text())
    assert kept_report["keep_loaded_wall"] is True
    assert all(isinstance(kept_report["arms"][arm]["wall_s"], float) for arm in ("gate", "async-grpo"))
    ratio = kept_report["comparisons"]["async-grpo"]["wall_ratio"]
    assert ratio["ci_low"] <= ratio["estimate"] <= ratio["ci_high"] and ratio["seeds"] == [0]

    rebuilt = subprocess.run([sys.executable, "run.py", "ab", "report", str(ab_dir.parent), "--baseline", "async-grpo"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads((ab_dir / "report.json").read_text())["baseline"] == "async-grpo"
    assert re.search(r"\| gate \| 1( \(1 loaded\))? \|", (ab_dir / "report.md").read_text())  # the seeds column names a loaded run


STUDY_ARMS = ("sync-grpo", "async-grpo", "gate-stall-learn", "gate-learn", "composed-learn", "gate-stall-shadow-learn")
"""The arms of the cost study (issue 36, configs/verdicts/cost-study.toml): the reference loop, the asynchronous loop,
the two gates at their learn-regime points, the composed arm, the stall gate in shadow."""


@pytest.mark.slow
def test_the_study_arms_run_on_the_learn_preset_with_the_target_rule(tmp_path):
    """The study's shape on the tiny budget: every arm on the learn preset, each run stopped at a held-out target
    measured every update on the `valid` range, and the report's time-to-target table with each seed reached
    or censored at its budget (which, on the tiny policy, is up to chance: the structure is checked)."""
    args = [sys.executable, "run.py", "ab", "--arms", ",".join(STUDY_ARMS), "--seeds", "0", "--budget", "tiny",
            "--config", "configs/learn.toml", "--target-heldout", "0.25", "--eval-every", "1", "--name", "study",
            "--out", str(tmp_path / "runs"), "--set", f'policy.cache_dir="{tmp_path / "cache"}"', "--set", "eval.curve_tasks=4",
            "--set", "gate.k=4", "--set", "gate.checkpoints=[6]"]  # the learn arms' K = 10-25 inside the tiny 12-step episodes
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ab_dir = tmp_path / "runs" / "study" / "ab"
    report = json.loads((ab_dir / "report.json").read_text())
    assert report["stop_rule"] == {"kind": "target_heldout", "target": 0.25, "stops": True}
    assert report["missing"] == [] and set(report["arms"]) == set(STUDY_ARMS)
    for arm in STUDY_ARMS:
        summary = json.loads((ab_dir / f"{arm}-s0" / "summary.json").read_text())
        figures = report["arms"][arm]["per_seed"]["0"]
        assert summary["heldout_curve_range"] == "valid"  # the stop rule never reads the test range
        if figures["target_reached"] == 1.0:
            assert summary["stop_reason"] == "target_heldout", arm
        else:  # censored: it counts at the GRPO wall clock it ran
            assert figures["target_reached"] == 0.0 and summary["stop_reason"] in ("updates", "max_wall_s"), arm
            assert figures["time_to_target_s"] in (None, pytest.approx(summary["grpo_wall_s"]))  # None: a loaded run's wall
    text = (ab_dir / "report.md").read_text()
    assert "## Time to held-out success ≥ 25%" in text
    assert all(re.search(rf"^\| {re.escape(arm)} \|", text, re.M) for arm in STUDY_ARMS)
