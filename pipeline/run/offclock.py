"""The held-out curve measured off the run's clock: `python run.py curve RUN_DIR`.

A run with `run.keep_weights_every = N` keeps the weights it published every N updates
(`checkpoints/policy-v<N>.pt`, `resume.Checkpointer`). After the run has ended, in its own process, this
measures each kept version on the periodic measure's tasks (`eval.curve_range`, `eval.periodic_tasks()`
per split) and writes `heldout_curve.jsonl` beside metrics.jsonl: one `heldout/...` row per version,
stamped with the GRPO wall clock, env steps and generated tokens of the update that published it (the
run's own metrics.jsonl row for that iteration). The timed run never shares its cores with a measure; the
A/B harness runs this after each run when a study reads a curve (`run.py ab --to-budget`), and its report
reads these rows as it reads the in-run ones. A version already measured is not measured again.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CURVE_FILE = "heldout_curve.jsonl"
_WEIGHTS = re.compile(r"policy-v(\d+)\.pt$")


def kept_versions(run_dir: Path) -> dict[int, Path]:
    """The versions whose published weights the run kept, and their files."""
    folder = run_dir / "checkpoints"
    found = {int(m.group(1)): p for p in folder.glob("policy-v*.pt") if (m := _WEIGHTS.search(p.name))} if folder.is_dir() else {}
    return dict(sorted(found.items()))


def stamps(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per update (metrics.jsonl `iteration`): the GRPO wall clock, env steps and generated tokens when it was published."""
    path = run_dir / "metrics.jsonl"
    out: dict[int, dict[str, float]] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("iteration"), int) and "wall_s" in row and not any(k.startswith("heldout/") for k in row):
            out[row["iteration"]] = {k: row[k] for k in ("wall_s", "env_steps", "generated_tokens") if isinstance(row.get(k), int | float)}
    return out


def measured(run_dir: Path) -> dict[int, dict[str, Any]]:
    path = run_dir / CURVE_FILE
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(r["iteration"]): r for r in rows if isinstance(r, dict) and "iteration" in r}


def curve_row(version: int, stamp: Mapping[str, float], scores: Mapping[str, float], range_name: str) -> dict[str, Any]:
    """One row of heldout_curve.jsonl: the version's stamp and its scores, as the in-run `heldout/...` rows."""
    return {"iteration": version, **stamp, **{f"heldout/{k}": v for k, v in scores.items()}, "heldout_range": range_name,
            "measured": "after the run, off its clock"}


async def measure_curve(cfg: Any, run_dir: Path) -> list[dict[str, Any]]:
    """Measure every kept version not measured yet; returns the rows of heldout_curve.jsonl (all of them)."""
    import torch
    import trio

    from pipeline.task_ranges import heldout_ranges

    from . import build
    from .job import _close_policies, evaluate_heldout
    from .summary import mean_success

    done = measured(run_dir)
    todo = {v: p for v, p in kept_versions(run_dir).items() if v not in done}
    when = stamps(run_dir)
    if todo:
        suite = build.suite(cfg)
        splits = heldout_ranges(suite.tasks, cfg.eval.splits, cfg.eval.curve_range, cfg.eval.sizes(), cfg.eval.periodic_tasks())
        policy = await trio.to_thread.run_sync(lambda: build.policy(cfg, suite, workers=1))
        try:
            for version, path in todo.items():
                state = torch.load(io.BytesIO(path.read_bytes()), weights_only=True)  # tensors only: never unpickled objects
                policy.load_weights(version, state)
                reports = await evaluate_heldout(policy, suite, splits, cfg.eval.greedy)
                scores = {split.removeprefix("heldout_"): r.success for split, r in reports.items()}
                if (mean := mean_success(reports)) is not None:
                    scores["mean"] = mean
                done[version] = curve_row(version, when.get(version, {}), scores, cfg.eval.curve_range)
                with (run_dir / CURVE_FILE).open("a") as f:
                    f.write(json.dumps(done[version]) + "\n")
                print(f"version {version}: held-out {scores.get('mean')} on {cfg.eval.curve_range}", flush=True)
        finally:
            await _close_policies([policy])
    return [done[v] for v in sorted(done)]
