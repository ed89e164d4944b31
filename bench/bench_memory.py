"""Flat memory: resident memory after N and after 10 N env steps of one GRPO run.

    python bench/bench_memory.py [--steps 2000] [--tracemalloc] [--set KEY=VALUE ...]

Runs the whole job (default configuration, warm start off so it starts at once, no held-out evaluation)
with an observer stage that counts env steps from the finished groups on the event stream and reads the
process's resident set size (/proc/self/statm) when the count passes N and 10 N, then stops the run.
The last line is `rss_growth=<fraction>` = (RSS at 10 N - RSS at N) / RSS at N; goal <= 0.05. Measures
with `run.flat_memory = true` (glibc's fixed mmap threshold) unless `--set run.flat_memory=false`. Structures
that grow with run length (lists of every sample, unbounded queues) show up here as growth.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import tracemalloc
from pathlib import Path

import msgspec
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.job import RunInterrupted, load, run_job  # noqa: E402
from pipeline.messages import GroupResult  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.stage import StageContext  # noqa: E402

PROBE: dict[str, object] = {}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class MemoryProbe:
    """Observer stage: RSS when the run's env steps pass `steps` and 10 x `steps`, then sets the stop event."""

    name = "memory_probe"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        steps: int

    def __init__(self, options: Options) -> None:
        steps = options.steps
        self.marks = [steps, 10 * steps]

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        events = ctx.subscribe()
        seen = 0
        readings: list[tuple[int, float]] = []
        async with events:
            task_status.started()
            async for message in events:
                if not isinstance(message, GroupResult):
                    continue
                seen += sum(len(t.turns) for t in message.trajectories)
                if seen >= self.marks[len(readings)]:
                    readings.append((seen, rss_mb()))
                    if tracemalloc.is_tracing():
                        PROBE.setdefault("snapshots", []).append(tracemalloc.take_snapshot())  # type: ignore[union-attr]
                    PROBE["readings"] = readings
                    if len(readings) == len(self.marks):
                        PROBE["stop"].set()  # type: ignore[attr-defined]
                        return


async def measure(steps: int, overrides: list[str]) -> dict[str, object]:
    PROBE["stop"] = stop = trio.Event()
    out = tempfile.mkdtemp(prefix="rollcut-mem-")
    cfg = load(None, [
        "pretrain.enabled=false", "eval.tasks=0", "run.updates=100000", "run.max_wall_s=3000", "run.progress=false",
        f'run.out="{out}"', f'stages=[{{target = "__main__:MemoryProbe", options = {{steps = {steps}}}}}]', "run.flat_memory=true", *overrides,
    ])
    try:
        await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False), stop=stop)
    except RunInterrupted:
        pass
    return {"readings": PROBE.get("readings", []), "run_dir": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="N: the first reading is after N env steps")
    parser.add_argument("--tracemalloc", action="store_true", help="also print the Python allocations that grew most")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    if args.tracemalloc:
        tracemalloc.start(8)
    result = trio.run(measure, args.steps, args.overrides)
    if args.tracemalloc and len(PROBE.get("snapshots", [])) == 2:
        first, last = PROBE["snapshots"]  # type: ignore[misc]
        for stat in last.compare_to(first, "traceback")[:8]:
            print(f"{stat.size_diff / 2**20:+.1f} MB in {stat.count_diff:+d} blocks:", *stat.traceback.format()[-6:], sep="\n  ")
    readings = result["readings"]
    if len(readings) < 2:
        sys.exit(f"bench_memory: the run stopped before {10 * args.steps} env steps ({readings})")
    (n1, rss1), (n2, rss2) = readings
    print(f"env steps {n1}: RSS {rss1:.1f} MB")
    print(f"env steps {n2}: RSS {rss2:.1f} MB")
    print(f"peak RSS (ru_maxrss): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB")
    print(f"rss_growth={(rss2 - rss1) / rss1:.4f}")


if __name__ == "__main__":
    main()
