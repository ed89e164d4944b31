"""Decoding in worker processes vs one decoding thread: env-steps/s of the default pipeline, side by side.

    python bench/bench_workers.py [--workers 2] [--seconds 60] [--rounds 2]
    python bench/bench_workers.py --workers 1,4,8,12 --seconds 45 --rounds 1 --out runs/workers [--set KEY=VALUE ...]

Each round runs the default GRPO phase (gate on, learner training as configured) for `--seconds` with
`policy.workers = 1` (decoding in a thread of this process) and with each count of `--workers` decoding
processes, alternating so that machine noise hits every arm alike. Prints each round, then a table of
env-steps/s per arm with its ratio to one worker, then as its last line `workers_speedup=<ratio>` (the
largest count against 1). Goal on 2 cores with 2 workers: >= 1.6.

`--out DIR` also profiles each arm as a run does and keeps, per arm, `DIR/w<N>/` with profile_table.json
and profile.png (the last round's), and `DIR/workers.md` with the table and each arm's per-stage table.
`--set` applies config overrides (e.g. `policy.device=cpu`, `learner.device=cuda`) to every arm.

Uses the default configuration's policy (its cached warm start; trained on first use).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

import trio
from bench_pipeline import pipeline_run  # noqa: I001 (bench/ is on sys.path when run as a script)

from pipeline.profiling import load_report
from pipeline.run import build
from pipeline.run.checks import load
from pipeline.rundir import configure_logging


def arms(spec: str) -> list[int]:
    """The worker counts to compare: 1 (the baseline) and every count named."""
    counts = {int(part) for part in spec.split(",") if part.strip()}
    if not counts or min(counts) < 1:
        raise SystemExit(f"--workers: worker counts >= 1, comma-separated (got {spec!r})")
    return sorted(counts | {1})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="2", help="decoding processes to compare with 1, e.g. 2 or 1,4,8,12")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep each arm's profile table and PNG here")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a config override, KEY=VALUE")
    args = parser.parse_args()
    counts = arms(args.workers)
    configure_logging(None)
    cfg = load(None, [f"run.max_wall_s={args.seconds}", "run.progress=false", "run.updates=100000", *args.overrides])
    suite = build.suite(cfg)
    print(f"building the default policy (cached warm start; policy.device={cfg.policy.device}, "
          f"learner.device={cfg.learner.device})...", flush=True)
    tasks = list(suite.tasks("train"))[: cfg.env.train_tasks]
    rates: dict[int, list[float]] = {n: [] for n in counts}
    updates: dict[int, list[int]] = {n: [] for n in counts}
    occupancy: dict[int, list[float]] = {n: [] for n in counts}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for workers in counts:
                policy = build.policy(cfg, suite, workers=workers)
                run_dir = Path(tmp) / f"w{workers}-{r}"
                run_dir.mkdir()
                outcome = trio.run(lambda: pipeline_run(cfg, policy, suite, tasks, run_dir, profile=args.out is not None))  # noqa: B023
                policy.close()  # the pool's worker processes (`Policy.close`)
                rates[workers].append(outcome.env_steps / outcome.rollout_wall_s)  # after the decoders started
                updates[workers].append(outcome.updates)
                occupancy[workers].append(outcome.trajectory_slot_occupancy)
                print(f"round {r + 1}: {workers:2d} decoding worker(s): {rates[workers][-1]:7.1f} env-steps/s "
                      f"({outcome.env_steps} steps, {outcome.updates} updates, decoders started in "
                      f"{outcome.counters.start_s:.1f} s, trajectory slot occupancy "
                      f"{outcome.trajectory_slot_occupancy:.2f})", flush=True)
                if args.out is not None:
                    _keep_profile(run_dir, args.out / f"w{workers}")
    table = _table(counts, rates, updates, occupancy)
    print(table)
    if args.out is not None:
        _write_summary(args.out, counts, table, args)
    speedup = statistics.mean(rates[counts[-1]]) / statistics.mean(rates[1])
    if counts == [1, 2]:
        print(f"goal on 2 cores >= 1.6: {'met' if speedup >= 1.6 else 'MISSED'}")
    print(f"workers_speedup={speedup:.3f}")


def _table(counts: list[int], rates: dict[int, list[float]], updates: dict[int, list[int]],
           occupancy: dict[int, list[float]]) -> str:
    base = statistics.mean(rates[1])
    lines = ["| decoding workers | env-steps/s (mean of rounds) | vs 1 worker | trajectory slot occupancy (mean) "
             "| learner updates per round |",
             "|---:|---:|---:|---:|---|"]
    for n in counts:
        mean = statistics.mean(rates[n])
        lines.append(f"| {n} | {mean:.1f} | {mean / base:.2f}x | {statistics.mean(occupancy[n]):.2f} "
                     f"| {', '.join(map(str, updates[n]))} |")
    return "\n".join(lines)


def _keep_profile(run_dir: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for name in ("profile_table.json", "profile.png"):
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, into / name)


def _write_summary(out: Path, counts: list[int], table: str, args: argparse.Namespace) -> None:
    parts = [f"# bench_workers: --workers {args.workers} --seconds {args.seconds:g} --rounds {args.rounds}"
             + (f" --set {' --set '.join(args.overrides)}" if args.overrides else ""), "", table]
    for n in counts:
        if (out / f"w{n}" / "profile_table.json").exists():
            parts += ["", f"## {n} decoding worker(s), last round", "", load_report(out / f"w{n}").table_markdown()]
    (out / "workers.md").write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
