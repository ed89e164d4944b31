"""Flat memory: resident memory after N, 2 N, ... 10 N env steps of one GRPO run, and its speed.

    python bench/bench_memory.py [--steps 2000] [--malloc MODE] [--tracemalloc] [--objects] [--set KEY=VALUE ...]
    python bench/bench_memory.py --compare MODE,MODE[,...] [--steps 2000]

Runs the whole job (default configuration, warm start off so it starts at once, no held-out evaluation)
with an observer stage that counts env steps from the finished groups on the event stream and reads the
process's resident set size (/proc/self/statm) each time the count passes a multiple of N, then stops the
run at 10 N. The last line is `rss_growth=<fraction>` = (RSS at 10 N - RSS at N) / RSS at N; goal <= 0.05.
`env_steps_per_s` is the speed between the N and 10 N readings (after start-up).

--malloc picks glibc's settings (pipeline/memory.py): `flat` (the default: `run.flat_memory = true`, the
fixed mmap threshold, with the configured arena cap), `run` (what `run.py` does with the configuration as
given: by default glibc's settings), `glibc` (glibc's defaults), `arenas` (2 malloc arenas only), `mmap`
(the fixed threshold only), `trim` (glibc's defaults and malloc_trim after every learner update),
`arenas_env` (MALLOC_ARENA_MAX=2 from process start; --compare only). --compare runs one process per mode
at the same time (noise hits all of them) and prints each one's growth and its speed relative to the first.
Structures that grow with run length (lists of every sample, unbounded queues) show up here as growth;
--tracemalloc and --objects show Python allocations and object types that grew between N and 10 N.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import msgspec
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import memory  # noqa: E402
from pipeline.messages import GroupResult, WeightsPublished  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from pipeline.run.job import RunInterrupted, run_job  # noqa: E402
from pipeline.stage import StageContext  # noqa: E402

MODES = {
    "flat": ["run.flat_memory=true"],  # the fixed mmap threshold on top of the configured arena cap
    "run": [],  # what the configuration says (glibc's defaults unless run.malloc_arenas / run.flat_memory)
    "glibc": ["run.malloc_arenas=0", "run.flat_memory=false"],
    "arenas": ["run.malloc_arenas=2", "run.flat_memory=false"],
    "mmap": ["run.malloc_arenas=0", "run.flat_memory=true"],
    "trim": ["run.malloc_arenas=0", "run.flat_memory=false"],  # + malloc_trim(0) at every learner update
    "arenas_env": ["run.malloc_arenas=0", "run.flat_memory=false"],  # MALLOC_ARENA_MAX=2 from process start (--compare)
}
ENV = {"arenas_env": {"MALLOC_ARENA_MAX": "2"}}
PROBE: dict[str, object] = {}


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def object_counts() -> collections.Counter[str]:
    """Live objects tracked by the garbage collector, by type name (what grows shows up here)."""
    gc.collect()
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


class MemoryProbe:
    """Observer stage: RSS at every multiple of `steps` env steps up to 10 x, then sets the stop event."""

    name = "memory_probe"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        steps: int

    def __init__(self, options: Options) -> None:
        self.marks = [options.steps * i for i in range(1, 11)]

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        events = ctx.subscribe()
        seen = 0
        readings: list[tuple[int, float, float]] = []  # (env steps, RSS MB, monotonic s)
        PROBE["readings"] = readings
        async with events:
            task_status.started()
            async for message in events:
                if isinstance(message, WeightsPublished) and PROBE.get("trim"):
                    await trio.to_thread.run_sync(memory.trim)
                if not isinstance(message, GroupResult):
                    continue
                seen += sum(len(t.turns) for t in message.trajectories)
                if seen < self.marks[len(readings)]:
                    continue
                readings.append((seen, rss_mb(), time.monotonic()))
                if len(readings) in (1, len(self.marks)):
                    if PROBE.get("objects"):
                        PROBE.setdefault("counts", []).append(object_counts())  # type: ignore[union-attr]
                    if tracemalloc.is_tracing():
                        PROBE.setdefault("snapshots", []).append(tracemalloc.take_snapshot())  # type: ignore[union-attr]
                if len(readings) == len(self.marks):
                    PROBE["stop"].set()  # type: ignore[attr-defined]
                    return


async def measure(steps: int, overrides: list[str]) -> list[tuple[int, float, float]]:
    PROBE["stop"] = stop = trio.Event()
    out = tempfile.mkdtemp(prefix="rollcut-mem-")
    cfg = load(None, [
        "pretrain.enabled=false", "eval.tasks=0", "run.updates=100000", "run.max_wall_s=3000", "run.progress=false",
        f'run.out="{out}"', f'stages=[{{target = "__main__:MemoryProbe", options = {{steps = {steps}}}}}]', *overrides,
    ])
    try:
        await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False), stop=stop)
    except RunInterrupted:
        pass
    return PROBE.get("readings", [])  # type: ignore[return-value]


def print_growth() -> None:
    if len(PROBE.get("snapshots", [])) == 2:
        first, last = PROBE["snapshots"]  # type: ignore[misc]
        for stat in last.compare_to(first, "traceback")[:8]:
            print(f"{stat.size_diff / 2**20:+.1f} MB in {stat.count_diff:+d} blocks:", *stat.traceback.format()[-6:], sep="\n  ")
    if len(PROBE.get("counts", [])) == 2:
        first_counts, last_counts = PROBE["counts"]  # type: ignore[misc]
        print("object types that grew (count at N -> at 10 N):")
        for kind, n in (last_counts - first_counts).most_common(15):
            print(f"  {kind}: {first_counts[kind]} -> {last_counts[kind]} (+{n})")


def one(args: argparse.Namespace) -> dict[str, float]:
    """Measure one mode in this process; prints the readings and returns the figures."""
    if args.tracemalloc:
        tracemalloc.start(8)
    PROBE["objects"] = args.objects
    overrides = [*MODES[args.malloc], *args.overrides]
    PROBE["trim"] = args.malloc == "trim"
    readings = trio.run(measure, args.steps, overrides)
    print_growth()
    if len(readings) < 10:
        sys.exit(f"bench_memory: the run stopped before {10 * args.steps} env steps ({readings})")
    for n, rss, _ in readings:
        print(f"env steps {n}: RSS {rss:.1f} MB")
    (n1, rss1, t1), (n2, rss2, t2) = readings[0], readings[-1]
    return {"rss_growth": (rss2 - rss1) / rss1, "rss_at_n_mb": rss1, "rss_at_10n_mb": rss2,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "env_steps_per_s": (n2 - n1) / (t2 - t1)}


def compare(args: argparse.Namespace) -> float:
    """One process per mode, all at once; prints a table and returns the first mode's growth."""
    modes = args.compare.split(",")
    procs = [subprocess.Popen([sys.executable, __file__, "--steps", str(args.steps), "--malloc", mode, "--json",
                               *(f"--set={o}" for o in args.overrides)], stdout=subprocess.PIPE, text=True,
                              env=os.environ | ENV.get(mode, {})) for mode in modes]
    results = []
    for mode, proc in zip(modes, procs, strict=True):
        out, _ = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"bench_memory: mode {mode} failed (exit {proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    base = results[0]["env_steps_per_s"]
    for mode, r in zip(modes, results, strict=True):
        print(f"{mode:>6}: rss_growth {r['rss_growth']:.4f}  RSS {r['rss_at_n_mb']:.0f} -> {r['rss_at_10n_mb']:.0f} MB  "
              f"peak {r['peak_rss_mb']:.0f} MB  {r['env_steps_per_s']:.1f} env-steps/s ({r['env_steps_per_s'] / base:.2f} x {modes[0]})")
    return results[0]["rss_growth"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="N: the first reading is after N env steps")
    parser.add_argument("--malloc", choices=MODES, default="flat", help="glibc malloc settings (see above)")
    parser.add_argument("--compare", metavar="MODE,MODE", help="run these modes side by side, one process each")
    parser.add_argument("--tracemalloc", action="store_true", help="also print the Python allocations that grew most")
    parser.add_argument("--objects", action="store_true", help="also print the object types whose count grew most")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # --compare's children
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    if args.compare:
        growth = compare(args)
    else:
        result = one(args)
        if args.json:
            print(json.dumps(result))
            return
        print(f"peak RSS (ru_maxrss): {result['peak_rss_mb']:.1f} MB; {result['env_steps_per_s']:.1f} env-steps/s after N")
        growth = result["rss_growth"]
    print(f"rss_growth={growth:.4f}")


if __name__ == "__main__":
    main()
