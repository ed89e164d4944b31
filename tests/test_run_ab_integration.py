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
