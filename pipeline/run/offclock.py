"""The held-out curve measured off the run's clock: `eval.curve_off_clock`, and `python run.py curve RUN_DIR`.

A run with `run.keep_weights_every = N` keeps the weights it published every N updates
(`checkpoints/policy-v<N>.pt`, `resume.Checkpointer`). After the run's clock has stopped, this measures each
kept version on the periodic measure's tasks (`eval.curve_range`, `eval.periodic_tasks()` per split) and writes
`heldout_curve.jsonl` beside metrics.jsonl: one `heldout/...` row per version, stamped with the GRPO wall clock,
env steps and generated tokens of the update that published it (the run's own metrics.jsonl row for that
iteration). With `eval.curve_off_clock` the run does it itself, once its summary is written, on the policy it
already has (`measure_kept`); `run.py curve` does it in a process of its own (`measure_curve`) for the versions
a run left unmeasured. Either way the timed run never shares its cores with a measure. The A/B harness sets
`eval.curve_off_clock` for a study that reads a curve (`run.py ab --to-budget`) and runs `run.py curve` only
for a run whose curve misses a kept version (`unmeasured`); its report reads these rows as it reads the in-run
ones. A version already measured is not measured again.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import trio

from pipeline.config import RunConfig
from pipeline.heldout_curve import CURVE_FILE, append_row, curve_row, measured, stamps, unmeasured
from pipeline.task_ranges import heldout_ranges
from stages.envs import EnvSuite
from stages.policy import Policy

from . import build
from .heldout import evaluate_heldout, mean_success


async def measure_kept(cfg: RunConfig, run_dir: Path, policy: Policy, suite: EnvSuite, *,
                       say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Measure every kept version not measured yet on `policy` (a policy of the run's backend, not serving: each
    version's weights replace whatever it holds), appending each row as it is measured; returns the rows of
    heldout_curve.jsonl (all of them)."""

    done = measured(run_dir)
    todo = unmeasured(run_dir)
    when = stamps(run_dir)
    splits = heldout_ranges(suite.tasks, cfg.eval.splits, cfg.eval.curve_range, cfg.eval.sizes(), cfg.eval.periodic_tasks()) if todo else {}
    for version, path in todo.items():
        state = torch.load(io.BytesIO(path.read_bytes()), weights_only=True)  # tensors only: never unpickled objects
        policy.load_weights(version, state)
        reports = await evaluate_heldout(policy, suite, splits, cfg.eval.greedy)
        scores = {split.removeprefix("heldout_"): r.success for split, r in reports.items()}
        if (mean := mean_success(reports)) is not None:
            scores["mean"] = mean
        done[version] = curve_row(version, when.get(version, {}), scores, cfg.eval.curve_range)
        append_row(run_dir / CURVE_FILE, done[version])
        say(f"version {version}: held-out {scores.get('mean')} on {cfg.eval.curve_range}")
    return [done[v] for v in sorted(done)]


async def measure_curve(cfg: RunConfig, run_dir: Path) -> list[dict[str, Any]]:
    """`run.py curve`: `measure_kept` on a policy of its own (built only when a version is left to measure)."""
    from .job import _close_policies  # job imports this module

    if not unmeasured(run_dir):
        return [row for _v, row in sorted(measured(run_dir).items())]
    suite = build.suite(cfg)
    policy = await trio.to_thread.run_sync(lambda: build.policy(cfg, suite, workers=1))
    try:
        return await measure_kept(cfg, run_dir, policy, suite, say=lambda line: print(line, flush=True))
    finally:
        await _close_policies([policy])
