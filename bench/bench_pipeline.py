"""Pipeline throughput and slot occupancy, measured side by side in one run.

    python bench/bench_pipeline.py [--seconds 20] [--rounds 2]

1. env steps/s of the full pipeline (admission loop, rollout groups under cancel scopes, ZMQ step
   stream, gate stage deciding every group in shadow mode, results over ZMQ to the learner stage)
   ÷ env steps/s of a bare loop that drives the same policy and environment with the same concurrency
   (slots) and no ZMQ, gate or learner. Goal >= 0.90. The learner is given a batch size it never fills
   so both arms spend the CPU on the same work; rounds alternate bare / pipeline to share the noise.
2. slot occupancy (busy slot-seconds / total) with the default gate cutting and the learner training as
   configured (default staleness bound). Goal >= 0.95.

Uses the default configuration's policy (its cached warm start; trained on first use).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's packages, as the other benches

from pipeline.profiling import Profiler  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from pipeline.run.grpo import run_grpo  # noqa: E402
from pipeline.run.parts import RunParts  # noqa: E402
from pipeline.rundir import MetricsWriter, configure_logging  # noqa: E402
from stages.episode import EpisodeStep, play_episode  # noqa: E402


async def bare_loop(policy, suite, tasks, slots: int, seconds: float) -> float:
    """env steps/s of `slots` concurrent episodes driven directly (no pipeline), counted per step."""
    steps = 0
    task_iter = itertools.cycle(tasks)

    async def count(step: EpisodeStep) -> None:
        nonlocal steps
        steps += 1

    async def worker() -> None:
        while True:
            env = suite.make()
            try:
                await play_episode(policy, env, next(task_iter), suite.max_steps, on_step=count)
            finally:
                env.close()

    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        started = trio.current_time()
        for _ in range(slots):
            nursery.start_soon(worker)
        await trio.sleep(seconds)
        elapsed = trio.current_time() - started
        nursery.cancel_scope.cancel()
    return steps / elapsed


async def pipeline_run(cfg, policy, suite, tasks, run_dir: Path, *, profile: bool = False):
    """The GRPO phase on `policy` for `cfg.run.max_wall_s`. `profile`: profile it as a run does (`[profile]`:
    GPU stages, CPU and NVML sampling) and write profile.json / profile_table.json / profile.png in `run_dir`."""
    allocator = build.allocator(cfg, list(tasks))
    trainer = build.trainer(cfg, policy.trainable())
    metrics = MetricsWriter(run_dir)
    profiler = (Profiler.from_config(cfg.profile, thread_cpu=cfg.profile.thread_cpu, gpu_stages=cfg.profile.gpu_stages)
                if profile else Profiler(enabled=True))
    async with profiler.sampling() if profile else contextlib.nullcontext():
        outcome = await run_grpo(RunParts(
            cfg=cfg, run_dir=run_dir, suite=suite, policy=policy, tasks={t.task_id: t for t in tasks},
            allocator=allocator, trainer=trainer, profiler=profiler, metrics=metrics,
        ))
    metrics.close()
    if profile:
        profiler.write(run_dir)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    configure_logging(None)
    base = load(None, [])
    suite = build.suite(base)
    print("building the default policy (cached warm start)...", flush=True)
    policy = build.policy(base, suite)
    tasks = list(suite.tasks("train"))[: base.env.train_tasks]
    shadow = load(None, [
        "gate.shadow=true", "learner.batch_groups=1000000", "learner.max_staleness=0",
        f"run.max_wall_s={args.seconds}", "run.progress=false",
    ])
    bare, piped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            bare.append(trio.run(bare_loop, policy, suite, tasks, base.rollout.slots, args.seconds))
            run_dir = Path(tmp) / f"shadow-{r}"
            run_dir.mkdir()
            outcome = trio.run(pipeline_run, shadow, policy, suite, tasks, run_dir)
            piped.append(outcome.env_steps / outcome.wall_s)
            print(f"round {r + 1}: bare {bare[-1]:7.1f} steps/s   pipeline {piped[-1]:7.1f} steps/s   "
                  f"(gate decisions {outcome.gate.decisions}, {outcome.gate.statistics()['gate/us_per_decision'] or 0:.1f} us each)",
                  flush=True)
        cutting = load(None, [f"run.max_wall_s={args.seconds * 3}", "run.progress=false", "run.updates=1000"])
        run_dir = Path(tmp) / "cutting"
        run_dir.mkdir()
        t0 = time.perf_counter()
        outcome = trio.run(pipeline_run, cutting, policy, suite, tasks, run_dir)
        wall = time.perf_counter() - t0
    ratio = statistics.mean(piped) / statistics.mean(bare)
    print()
    print(f"pipeline env-steps/s ÷ bare loop: {ratio:.3f}   goal >= 0.90: {'met' if ratio >= 0.90 else 'MISSED'}"
          f"   (bare {statistics.mean(bare):.1f}, pipeline {statistics.mean(piped):.1f} steps/s, {args.rounds} rounds x {args.seconds:.0f} s)")
    print(f"slot occupancy with the gate cutting: {outcome.slot_occupancy:.3f}   goal >= 0.95: "
          f"{'met' if outcome.slot_occupancy >= 0.95 else 'MISSED'}   ({outcome.counters.groups_cut} of "
          f"{outcome.counters.groups_finished} groups cut, {outcome.lifecycle.backfills} backfills, "
          f"{outcome.updates} learner updates in {wall:.0f} s)")


if __name__ == "__main__":
    main()
