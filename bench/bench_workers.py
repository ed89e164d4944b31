"""Decoding in worker processes vs one decoding thread: env-steps/s of the default pipeline, side by side.

    python bench/bench_workers.py [--workers 2] [--seconds 60] [--rounds 2]

Each round runs the default GRPO phase (gate on, learner training as configured) for `--seconds` with
`policy.workers = 1` (decoding in a thread of this process) and with `--workers` decoding processes,
alternating so that machine noise hits both arms alike. Prints each round, then as its last line
`workers_speedup=<env-steps/s ratio>`. Goal on 2 cores: >= 1.6.

Uses the default configuration's policy (its cached warm start; trained on first use).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import trio
from bench_pipeline import pipeline_run  # noqa: I001 (bench/ is on sys.path when run as a script)

from pipeline.job import build_policy, build_suite, load
from pipeline.rundir import configure_logging


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    configure_logging(None)
    cfg = load(None, [f"run.max_wall_s={args.seconds}", "run.progress=false", "run.updates=100000"])
    suite = build_suite(cfg)
    print("building the default policy (cached warm start)...", flush=True)
    tasks = list(suite.tasks("train"))[: cfg.env.train_tasks]
    rates: dict[int, list[float]] = {1: [], args.workers: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for workers in (1, args.workers):
                policy = build_policy(cfg, suite, workers=workers)
                run_dir = Path(tmp) / f"w{workers}-{r}"
                run_dir.mkdir()
                outcome = trio.run(pipeline_run, cfg, policy, suite, tasks, run_dir)
                rates[workers].append(outcome.env_steps / outcome.wall_s)
                print(f"round {r + 1}: {workers} decoding worker(s): {rates[workers][-1]:7.1f} env-steps/s "
                      f"({outcome.env_steps} steps, {outcome.updates} updates, trajectory slot occupancy "
                      f"{outcome.trajectory_slot_occupancy:.2f})", flush=True)
    speedup = statistics.mean(rates[args.workers]) / statistics.mean(rates[1])
    print(f"goal on 2 cores >= 1.6: {'met' if speedup >= 1.6 else 'MISSED'}")
    print(f"workers_speedup={speedup:.3f}")


if __name__ == "__main__":
    main()
