"""`run.py ab` on the tiny budget, real pipeline: two arms + the A/A arm x three seeds, then the report's structure
(not its numbers: the tiny policy's figures mean nothing) and `ab report` rebuilding it."""

import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_ab_tiny_writes_the_report(tmp_path):
    """The tiny study of issue 56: 2 arms + the A/A arm (the baseline again), 3 seeds, curves measured off the clock;
    every figure of the report is there (its numbers mean nothing on the tiny policy)."""
    args = [sys.executable, "run.py", "ab", "--arms", "gate,async-grpo", "--seeds", "0,1,2", "--budget", "tiny",
            "--target-heldout", "0.25", "--eval-every", "1", "--to-budget",
            "--out", str(tmp_path / "runs"), "--set", f'policy.cache_dir="{tmp_path / "cache"}"', "--set", "eval.curve_tasks=4"]
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    print(f"tiny study: {time.perf_counter() - started:.0f} s for 9 runs and their curves")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ab_dir = tmp_path / "runs" / "ab-tiny" / "ab"
    report = json.loads((ab_dir / "report.json").read_text())
    arms = ("gate", "gate-aa", "async-grpo")

    assert report["baseline"] == "gate" and report["aa_arm"] == "gate-aa" and list(report["arms"]) == list(arms)
    assert set(report["noise_floor"]) >= {"wall_ratio", "env_steps_ratio", "heldout_after_delta"}
    assert set(report["resolution"]) == {"async-grpo"}
    assert report["order"] == {"0": list(arms), "1": [*arms[1:], arms[0]], "2": [arms[2], *arms[:2]]}
    loaded = {(r["arm"], r["seed"]) for r in report["loaded_runs"]}
    for arm in arms:
        block = report["arms"][arm]
        assert block["seeds"] == [0, 1, 2]
        for key in ("env_steps", "groups_cut", "groups_trained", "heldout_success_after"):
            assert isinstance(block[key], int | float), (arm, key)
        for seed in (0, 1, 2):
            folder = ab_dir / f"{arm}-s{seed}"
            summary = json.loads((folder / "summary.json").read_text())
            # A run the machine's load flagged keeps its env steps but not its wall clock (CI's stress pass loads it).
            assert (block["per_seed"][str(seed)]["wall_s"] is None) == ((arm, seed) in loaded)
            # the held-out curve: measured by the run from its kept weights once its figures were written, never in
            # the timed run, and complete, so the harness started no `run.py curve` for it
            assert not (ab_dir / "logs" / f"{arm}-s{seed}.curve.log").exists(), (arm, seed)
            kept = sorted(int(p.stem.removeprefix("policy-v")) for p in (folder / "checkpoints").glob("policy-v*.pt"))
            metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
            assert not any(k.startswith("heldout/") for row in metrics for k in row), (arm, seed)
            curve = [json.loads(line) for line in (folder / "heldout_curve.jsonl").read_text().splitlines()]
            assert curve and all({"wall_s", "env_steps", "generated_tokens", "heldout/mean"} <= set(row) for row in curve), curve
            assert [row["iteration"] for row in curve] == kept, (arm, seed)
            # the run skipped its profile.png (no matplotlib import per run); the study drew it at its end
            assert tomllib.loads((folder / "config.toml").read_text())["profile"]["plot"] is False
            assert (folder / "profile.png").is_file(), (arm, seed)
            if "ledger" in summary:  # written by the pipeline from issue 56 on (item 1)
                fates = summary["ledger"]["fates"]
                assert sum(f["env_steps"] for f in fates.values()) == summary["env_steps"], (arm, seed)
                assert report["arms"][arm]["ledger"]["estimated"] is False
            else:
                assert report["arms"][arm]["ledger"]["estimated"] is True
        tt = report["time_to_target"][arm]
        counted = 3 - sum(1 for a, _s in loaded if a == arm)  # a loaded run's wall clock, and time, is left out
        assert tt["n"] == counted and 0 <= tt["reached"] <= counted and tt["horizon_s"] == report["stop_rule"]["horizon_s"]
    ratio = report["comparisons"]["async-grpo"]["env_steps_ratio"]
    assert ratio["ci_low"] <= ratio["estimate"] <= ratio["ci_high"] and ratio["seeds"] == [0, 1, 2]
    assert report["comparisons"]["async-grpo"]["time_to_target_ratio"]["status"] in ("not reached", "ratio", "lower bound", "no pairs")
    assert report["curve_range"] == "valid"  # named by the off-clock rows
    assert report["missing"] == [] and set(report["commits"]) == {f"{a}-s{s}" for a in arms for s in (0, 1, 2)}
    text = (ab_dir / "report.md").read_text()
    assert "A/A control arm: `gate-aa`" in text and "| gate-aa | " in text and "A/A: " in text and "Noise floor" in text
    assert "## Where decoder work went" in text and "restricted mean" in text and "Arm order per seed (rotated per seed)" in text
    assert {"report.md", "curves.png", "wall_ratio.png"} <= {p.name for p in ab_dir.iterdir()}
    assert any("profile.png drawn from profile.json for 9 run(s)" in note for note in report["notes"])

    rebuilt = subprocess.run([sys.executable, "run.py", "ab", "report", str(ab_dir.parent), "--baseline", "async-grpo",
                              "--keep-loaded-wall"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rebuilt.returncode == 0, rebuilt.stderr
    again = json.loads((ab_dir / "report.json").read_text())
    assert again["baseline"] == "async-grpo" and again["keep_loaded_wall"] is True
    for key in ("env_steps_ratio", "heldout_after_delta"):  # still gate-aa against gate, its copy (walls: now kept)
        assert again["noise_floor"][key] == pytest.approx(report["noise_floor"][key])
    assert re.search(r"\| gate \| 3( \(\d loaded\))? \|", (ab_dir / "report.md").read_text())  # the seeds column names loaded runs


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
            "--set", "gate.k=4", "--set", "gate.checkpoints=[6]",  # the learn arms' K = 10-25 inside the tiny 12-step episodes
            "--aa-arm", "gate-stall-shadow-learn", "--aa-of", "async-grpo"]  # the cost study's A/A arm
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ab_dir = tmp_path / "runs" / "study" / "ab"
    report = json.loads((ab_dir / "report.json").read_text())
    assert {k: v for k, v in report["stop_rule"].items() if k != "horizon_s"} == {"kind": "target_heldout", "target": 0.25, "stops": True}
    assert report["missing"] == [] and set(report["arms"]) == set(STUDY_ARMS) and report["aa_arm"] == "gate-stall-shadow-learn"
    assert report["aa_of"] == "async-grpo" and "sync-grpo" not in report["resolution"]
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
    assert "## Time to held-out success ≥ 25 %" in text
    assert all(re.search(rf"^\| {re.escape(arm)} \|", text, re.M) for arm in STUDY_ARMS)
