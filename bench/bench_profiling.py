"""Profiler overhead: cost per call, and throughput with the profiler on vs off, measured side by side.

    .venv/bin/python bench/bench_profiling.py [--rounds 15] [--steps 6400]

Three profiler modes are compared:
  off        Profiler(enabled=False): spans are a shared no-op context manager
  wall       Profiler(thread_cpu=False): spans read the wall clock only
  wall+cpu   Profiler() default: spans also read the thread CPU clock (one system call per boundary)

Workloads: a synchronous loop of ~20 us steps, and a Trio program of 64 tasks doing ~50 us of Python work
per step with a span around each step (plus `items` per step and a `gauge` every 64 steps). Each round
runs every mode once, in a rotating order; the printed ratio is the median over rounds of the paired
ratio mode/off. Throughput is given per wall second and per CPU second of the (single) workload thread;
the CPU figure is the one to trust on a shared, noisy machine. Prints ratios, asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.profiling import Profiler  # noqa: E402

MODES: dict[str, Callable[[], Profiler]] = {
    "off": lambda: Profiler(enabled=False),
    "wall": lambda: Profiler(gpu_sample_hz=0.0, thread_cpu=False),
    "wall+cpu": lambda: Profiler(gpu_sample_hz=0.0),
}

Rate = tuple[float, float]  # (steps per wall second, steps per thread-CPU second)


def calibrate(target_s: float) -> int:
    """Loop length n such that `sum(range(n))` takes about `target_s`."""
    n = 1000
    while True:
        t = time.thread_time()
        for _ in range(20):
            sum(range(n))
        per = (time.thread_time() - t) / 20
        if per > 1e-4:
            return max(1, round(n * target_s / per))
        n *= 2


def per_call_us(prof: Profiler, calls: int = 200_000) -> dict[str, float]:
    """Best-of-3 thread-CPU microseconds per span (enter + exit), `items` and `gauge` call."""

    def spans() -> None:
        for _ in range(calls):
            with prof.span("bench", "op"):
                pass

    def items() -> None:
        for _ in range(calls):
            prof.items("bench")

    def gauges() -> None:
        for i in range(calls):
            prof.gauge("queue/bench", i)

    out = {}
    for name, fn in (("span", spans), ("items", items), ("gauge", gauges)):
        best = float("inf")
        for _ in range(3):
            t = time.thread_time()
            fn()
            best = min(best, time.thread_time() - t)
        out[name] = best / calls * 1e6
    return out


def _rates(steps: int, wall0: float, cpu0: float) -> Rate:
    return steps / (time.perf_counter() - wall0), steps / (time.thread_time() - cpu0)


def sync_workload(prof: Profiler, steps: int, n: int) -> Rate:
    """A plain loop of `n`-sized work units, each in a span."""
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        with prof.span("worker", "step"):
            sum(range(n))
    return _rates(steps, wall0, cpu0)


def trio_workload(prof: Profiler, steps: int, n: int, tasks: int = 64) -> Rate:
    """`tasks` Trio tasks sharing `steps` steps of work, a span around each step."""
    per_task = steps // tasks

    async def rollout(i: int) -> None:
        for step in range(per_task):
            with prof.span("rollout", "env_step"):
                sum(range(n))
            prof.items("rollout")
            if step % 64 == 0:
                prof.gauge("rollout/in_flight", tasks - i)
            await trio.lowlevel.checkpoint()

    async def run_all() -> Rate:
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        async with trio.open_nursery() as nursery:
            for i in range(tasks):
                nursery.start_soon(rollout, i)
        return _rates(per_task * tasks, wall0, cpu0)

    return trio.run(run_all)


def compare(name: str, run: Callable[[Profiler], Rate], rounds: int) -> None:
    modes = list(MODES)
    rates: dict[str, list[Rate]] = {mode: [] for mode in modes}
    for r in range(rounds):
        shift = r % len(modes)
        for mode in modes[shift:] + modes[:shift]:  # rotate which mode runs first
            rates[mode].append(run(MODES[mode]()))
    print(f"\n{name}: {rounds} rounds; median of per-round ratios to off (wall | thread CPU)")
    off = rates["off"]
    for mode, values in rates.items():
        per_wall = statistics.median(v[0] / o[0] for v, o in zip(values, off, strict=True))
        per_cpu = statistics.median(v[1] / o[1] for v, o in zip(values, off, strict=True))
        print(
            f"  {mode:9s} {statistics.median(v[1] for v in values):9.0f} steps/cpu-s   "
            f"ratio {per_wall:.3f} | {per_cpu:.3f}   overhead {100 * (1 - per_cpu):+.1f}% (CPU)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=6_400)
    args = parser.parse_args()

    print("thread-CPU microseconds per call (best of 3 x 200k calls):")
    for mode, make in MODES.items():
        costs = per_call_us(make())
        print(f"  {mode:9s} " + "  ".join(f"{op} {us:.2f}" for op, us in costs.items()))
    t = time.thread_time()
    for _ in range(200_000):
        time.thread_time()
    print(
        f"  (one time.thread_time() call on this machine: {(time.thread_time() - t) / 200_000 * 1e6:.2f} us)"
    )

    n20, n50 = calibrate(20e-6), calibrate(50e-6)
    compare("sync loop, ~20 us per step", lambda p: sync_workload(p, args.steps, n20), args.rounds)
    compare("trio, 64 tasks, ~50 us per step", lambda p: trio_workload(p, args.steps, n50), args.rounds)


if __name__ == "__main__":
    main()
