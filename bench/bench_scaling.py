"""Decoders as Ray actors against decoders as local processes, at N decoders, side by side (docs/scaling.md).

    python bench/bench_scaling.py [--decoders 1,2,3,4] [--seconds 45] [--seeds 0,1,2] [--out docs/scaling]
                                  [--launchers processes,ray] [--set KEY=VALUE ...]

For each seed, each N and each launcher — `processes` (child processes of this one, `launch.LocalLauncher`)
and `ray` (actors on a Ray instance started on this machine for the bench: one node, `ray_launch.RayLauncher`)
— one GRPO phase of the default pipeline runs for `--seconds` with N decoding workers (the policy behind a
pool also at N = 1, so both launchers pay the same hop), in an order that alternates the launchers so that
machine noise hits both alike. Per arm it records env-steps/s, trajectory slot occupancy, this process's CPU
share (the coordinator: admission, rollout stage, gate and learner stages; the learner's update thread
included), the act() round trip (request to reply, p50 / p99), the learner's busy share, the event loop's lag
and the seconds the phase took to start (decoders and stages) before admission began. Rates and occupancy
are taken over the rollout window, after that start (`GrpoOutcome.rollout_wall_s`).

Prints each arm as it ends, then a table per N (mean and range over the seeds, Ray / processes ratio), and
writes `DIR/scaling.json` (every arm) and `DIR/scaling.md` (the table, the command, the machine, its load
before and after). `--launchers processes` runs without Ray (a machine that lacks it: the decoders' scaling
alone, `vs N=1` the ratio to the fewest decoders). Ray sees `max(N)` logical CPUs, so on a machine with fewer cores the actors share them as
the processes do. Goal (issue 38): Ray's env-steps/s within 10 % of processes mode at every N.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import trio
from bench_pipeline import pipeline_run  # noqa: I001 (bench/ is on sys.path when run as a script)

from pipeline.run import build
from pipeline.run.checks import load
from pipeline.run.decoding_pool import WorkerPoolPolicy
from pipeline.rundir import configure_logging

LAUNCHERS = ("processes", "ray")


def counts(spec: str) -> list[int]:
    found = sorted({int(part) for part in spec.split(",") if part.strip()})
    if not found or found[0] < 1:
        raise SystemExit(f"--decoders: counts >= 1, comma-separated (got {spec!r})")
    return found


def arm(cfg: Any, suite: Any, launcher: str, decoders: int, seed: int, run_dir: Path) -> dict[str, Any]:
    """One GRPO phase with `decoders` workers placed by `launcher`; its figures."""
    cfg = msgspec.structs.replace(cfg, run=msgspec.structs.replace(cfg.run, seed=seed),
                                  placement=msgspec.structs.replace(cfg.placement, launcher="ray" if launcher == "ray" else "local"))
    local = build.backend(cfg, suite)  # the cached warm start: every arm starts from the same weights
    policy = WorkerPoolPolicy(local.trainable, cfg, workers=decoders, launcher=build.launcher(cfg))
    tasks = list(suite.tasks("train"))[: cfg.env.train_tasks]
    cpu, wall = time.process_time(), time.perf_counter()
    outcome = trio.run(lambda: pipeline_run(cfg, policy, suite, tasks, run_dir, profile=True))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    stats = policy.statistics()
    policy.close()
    return {"launcher": launcher, "decoders": decoders, "seed": seed, "env_steps": outcome.env_steps,
            "grpo_wall_s": outcome.wall_s, "start_s": outcome.counters.start_s,
            "env_steps_per_s": outcome.env_steps / outcome.rollout_wall_s,  # after the decoders started
            "trajectory_slot_occupancy": outcome.trajectory_slot_occupancy, "slot_occupancy": outcome.slot_occupancy,
            "updates": outcome.updates, "loop_lag_p99_ms": outcome.loop_lag_p99_ms(), **_stage_figures(run_dir),
            "coordinator_cpu": cpu / wall, "round_trip_p50_ms": _ms(stats.round_trip_p50_s),
            "round_trip_p99_ms": _ms(stats.round_trip_p99_s)}


def _stage_figures(run_dir: Path) -> dict[str, float | None]:
    """From the arm's profile (this process's view): the learner's and the decoders' busy share, and the
    coordinator CPU no stage span accounts for."""
    rows = {r["stage"]: r for r in json.loads((run_dir / "profile_table.json").read_text())["rows"]}
    return {"learner_busy": rows.get("learner", {}).get("busy_pct"), "policy_busy": rows.get("policy", {}).get("busy_pct"),
            "unattributed_cpu": rows.get("(unattributed)", {}).get("cpu_pct")}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def table(rows: list[dict[str, Any]], decoders: list[int], launchers: tuple[str, ...] = LAUNCHERS) -> str:
    def figure(n: int, launcher: str, key: str) -> list[float]:
        return [r[key] for r in rows if r["decoders"] == n and r["launcher"] == launcher and r[key] is not None]

    def cell(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        mean = format(statistics.mean(values), fmt)
        return mean if len(values) == 1 else f"{mean} [{min(values):{fmt}}, {max(values):{fmt}}]"

    def ratio(rate: list[float], base: list[float]) -> str:
        return f"{statistics.mean(rate) / statistics.mean(base):.2f}x" if rate and base else "-"

    lines = [f"| N | launcher | env-steps/s | vs processes | vs N={decoders[0]} | trajectory slot occupancy | coordinator CPU "
             "| act() p50 / p99 ms | updates | learner busy | loop lag p99 ms | start s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in decoders:
        for launcher in launchers:
            rate = figure(n, launcher, "env_steps_per_s")
            p50, p99 = figure(n, launcher, "round_trip_p50_ms"), figure(n, launcher, "round_trip_p99_ms")
            lines.append(f"| {n} | {launcher} | {cell(rate, '.1f')} | {ratio(rate, figure(n, 'processes', 'env_steps_per_s'))} "
                         f"| {ratio(rate, figure(decoders[0], launcher, 'env_steps_per_s'))} | "
                         f"{cell(figure(n, launcher, 'trajectory_slot_occupancy'), '.2f')} | "
                         f"{cell([100 * c for c in figure(n, launcher, 'coordinator_cpu')], '.0f')} % | "
                         f"{cell(p50, '.1f')} / {cell(p99, '.1f')} | {cell(figure(n, launcher, 'updates'), '.0f')} | "
                         f"{cell(figure(n, launcher, 'learner_busy'), '.0f')} % | {cell(figure(n, launcher, 'loop_lag_p99_ms'), '.1f')} | "
                         f"{cell(figure(n, launcher, 'start_s'), '.1f')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decoders", default="1,2,3,4")
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="processes, ray or both (the default)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a config override, KEY=VALUE")
    args = parser.parse_args()
    decoders, seeds = counts(args.decoders), [int(s) for s in args.seeds.split(",")]
    launchers = tuple(name for name in LAUNCHERS if name in args.launchers.split(","))
    if not launchers or set(args.launchers.split(",")) - set(LAUNCHERS):
        raise SystemExit(f"--launchers: processes, ray or both, comma-separated (got {args.launchers!r})")
    configure_logging(None)
    load_before = os.getloadavg()
    cfg = load(None, [f"run.max_wall_s={args.seconds}", "run.progress=false", "run.updates=100000", *args.overrides])
    suite = build.suite(cfg)

    if "ray" in launchers:
        import ray

        from pipeline.run.ray_launch import init_options

        ray.init(**init_options(cfg.placement) | {"num_cpus": max(decoders)})
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for s_index, seed in enumerate(seeds):
                for n in decoders:
                    order = launchers if (s_index + n) % 2 == 0 else launchers[::-1]
                    for launcher in order:
                        run_dir = Path(tmp) / f"{launcher}-n{n}-s{seed}"
                        run_dir.mkdir()
                        rows.append(arm(cfg, suite, launcher, n, seed, run_dir))
                        r = rows[-1]
                        print(f"seed {seed}  N={n}  {launcher:9s} {r['env_steps_per_s']:7.1f} env-steps/s  occupancy "
                              f"{r['trajectory_slot_occupancy']:.2f}  coordinator CPU {100 * r['coordinator_cpu']:.0f} %  "
                              f"act p50/p99 {r['round_trip_p50_ms']:.1f}/{r['round_trip_p99_ms']:.1f} ms", flush=True)
    finally:
        if "ray" in launchers:
            ray.shutdown()
    load_after = os.getloadavg()
    text = table(rows, decoders, launchers)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
                   "load_before": load_before, "load_after": load_after}
        (args.out / "scaling.json").write_text(json.dumps({"command": sys.argv, "machine": machine, "arms": rows}, indent=1))
        (args.out / "scaling.md").write_text(
            f"# bench_scaling\n\n`python {' '.join(sys.argv)}` on {os.cpu_count()} CPUs, load average (1/5/15 min) "
            f"{'/'.join(f'{x:.2f}' for x in load_before)} before, {'/'.join(f'{x:.2f}' for x in load_after)} after; "
            f"mean [range] over seeds {args.seeds}.\n\n{text}\n")


if __name__ == "__main__":
    main()
