"""The default run's event-loop lag and peak memory, before against after, side by side in one run.

    python bench/bench_loop.py [--updates 8] [--seed 0] [--config configs/default.toml]
                               [--arm NAME=KEY=VALUE[,KEY=VALUE...] ...] [--set KEY=VALUE ...]
                               [--only NAME[,NAME...]] [--one-at-a-time]

Runs the same job (`run.py`, the config's warm start, held-out measures on 20 tasks per split) once per arm,
every arm at the same time (so the machine's noise hits all of them), and prints each arm's figures from its
summary.json and their ratio to the first arm's:

* `loop_lag_p99_ms`: the GRPO phase's event-loop lag p99 (a 10 ms sleep's overshoot, `monitor_loop_lag`);
  goal <= 5 ms (issue 60, item 13: 14.1 ms and 10.0 ms in default runs while the learner trains);
* `peak_rss_mb`: the run's process, whole job (ru_maxrss); goal <= 1.5 GB (issue 60: 2.7 GB and 3.6 GB);
* `env_steps_per_s` over the GRPO phase: "at unchanged speed" is a ratio near 1;

and, per arm, what held the loop (the summary's `loop_blockers`: the task steps and late wake-ups of 2 ms or more).

The arms by default: `before` (`run.gc_freeze=false`: Python's collector traverses the whole heap in every
full collection, holding the GIL; `run.gil_switch_ms=0`: Python's 5 ms GIL switch interval, which the loop may
wait at every socket wait while the learner's thread runs Python code; `learner.trim_memory=false`: each
thread an update ran on keeps its malloc arena at the update's high-water mark; `policy.worker_nice=0` and
`learner.thread_nice=0`: the decoders and the learner's thread at the loop's priority; `learner.micro_batch=64`:
an update's passes four times as large) and `after` (the defaults: the heap alive when GRPO starts frozen, `pipeline/memory.py:frozen_heap`; a 0.5 ms switch interval,
`pipeline/run/runtime.py:gil_switch_interval`; every update ending with `malloc_trim`; configs/default.toml's
decoders and learner thread at nice 19, below the loop, and 16 turns a pass). Add arms to tell the
three apart or to compare other settings, e.g. `--arm no-switch=run.gil_switch_ms=0`,
`--arm no-trim=learner.trim_memory=false`, `--arm micro16=learner.micro_batch=16`, `--arm flat=run.flat_memory=true`,
`--arm nice0=policy.worker_nice=0,learner.thread_nice=0` (decoders and learner at the loop's priority),
`--arm procs='transport.mode="processes"'` (the learner's thread out of the loop's process).

Measured (quiet machine, 2 cores, 8 updates, seed 0, `--one-at-a-time`, one sample an arm, 2026-11-29, before
configs/default.toml took nice 19): at nice 0 lag p99 11.2 ms, 1,294 MB, 229.9 env steps/s; decoders and
learner thread at nice 10: 5.6 ms, 1.02x, 1.03x; at 19: 5.0 ms, 0.88x, 1.20x; decoders alone at 19: 5.0 ms,
1.03x, 1.13x; `learner.micro_batch=16`: 8.9 ms, 888 MB (0.69x), 0.95x. Each run's peak RSS is in its GRPO
phase (`peak_rss_mb_by_phase`: 278 MB after the build, ~1.1-1.3 GB after GRPO).

`--only after` keeps only the named arms (defaults or added); `--one-at-a-time` runs the arms one after another,
each with the machine to itself: the absolute lag of a run alone (the goal's figure on 2 cores), where side by side
the arms share the cores (ratios then carry the machine's drift between arms instead).

The warm start is trained (or read from its cache) once, by `run.py pretrain`, before the arms start, so that
no arm trains it. Run it on a quiet machine: with every arm a job of its own, N arms need about N x 2 cores to
be measured fairly; the ratios still compare like with like when they share fewer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("loop_lag_p99_ms", "peak_rss_mb", "env_steps_per_s")
DEFAULT_ARMS = {"before": ["run.gc_freeze=false", "run.gil_switch_ms=0", "learner.trim_memory=false",
                           "policy.worker_nice=0", "learner.thread_nice=0", "learner.micro_batch=64"], "after": []}


def parse_arm(text: str) -> tuple[str, list[str]]:
    """`NAME=KEY=VALUE,KEY=VALUE` -> (NAME, [KEY=VALUE, ...]); `NAME=` is an arm of the defaults."""
    name, _, sets = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"an arm is NAME=KEY=VALUE[,...], got {text!r}")
    return name, [s for s in sets.split(",") if s]


def selected_arms(added: list[tuple[str, list[str]]], only: str | None) -> dict[str, list[str]]:
    """The default arms and the added ones (an added name replaces a default's settings), kept to `only`'s names in
    their order; an unknown name in `only` is an error naming the known ones."""
    arms = dict(DEFAULT_ARMS) | dict(added)
    if only is None:
        return arms
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in arms]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--only {only!r}: unknown arm(s) {unknown} (known: {', '.join(arms)})")
    return {n: arms[n] for n in names}


def figures(summary: dict) -> dict[str, float | None]:
    """The three figures of one arm's summary.json."""
    steps, wall = summary.get("env_steps"), summary.get("grpo_wall_s")
    return {"loop_lag_p99_ms": summary.get("loop_lag_p99_ms"), "peak_rss_mb": summary.get("peak_rss_mb"),
            "env_steps_per_s": steps / wall if steps and wall else None}


def table(results: dict[str, dict[str, float | None]]) -> list[str]:
    """One line per arm: each figure and its ratio to the first arm's."""
    first = next(iter(results.values()))
    lines = []
    for name, row in results.items():
        cells = []
        for key in FIGURES:
            value, base = row[key], first[key]
            ratio = f" ({value / base:.2f}x)" if value is not None and base else ""
            cells.append(f"{key} {'n/a' if value is None else f'{value:.1f}'}{ratio}")
        lines.append(f"{name:<10} " + "   ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "default.toml"))
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arm", type=parse_arm, action="append", default=[], help="NAME=KEY=VALUE[,KEY=VALUE...]")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="for every arm")
    parser.add_argument("--only", help="run only these arms (comma-separated names)")
    parser.add_argument("--one-at-a-time", action="store_true", help="run the arms one after another, each alone")
    args = parser.parse_args(argv)
    try:
        arms = selected_arms(args.arm, args.only)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    common = [f"run.seed={args.seed}", f"run.updates={args.updates}", "eval.tasks=20", "run.progress=false",
              *args.overrides]
    run_py = [sys.executable, str(ROOT / "run.py"), "--config", args.config]
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as out:
        sets = [x for s in common for x in ("--set", s)]
        subprocess.run([*run_py, "pretrain", *sets, "--out", out], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)  # once
        def start(name: str, extra: list[str]) -> subprocess.Popen[str]:
            return subprocess.Popen([*run_py, *sets, *(x for s in extra for x in ("--set", s)),
                                     "--set", f"run.name={name!r}".replace("'", '"'), "--out", out],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)

        results, blocked, phases = {}, {}, {}
        children = {} if args.one_at_a_time else {name: start(name, extra) for name, extra in arms.items()}
        for name, extra in arms.items():
            child = children.get(name) or start(name, extra)
            _, err = child.communicate()
            if child.returncode != 0:
                print(f"arm {name}: run.py exited {child.returncode}\n{err[-2000:]}", file=sys.stderr)
                return 1
            summary = json.loads((Path(out) / name / "summary.json").read_text())
            results[name], blocked[name] = figures(summary), summary.get("loop_blockers", [])
            phases[name] = summary.get("peak_rss_mb_by_phase", {})
    how = "one at a time" if args.one_at_a_time else "arms at the same time"
    print(f"{args.updates} updates, seed {args.seed}, {Path(args.config).name}; {how}; ratios to {next(iter(arms))}")
    for line in table(results):
        print(line)
    for name, rows in blocked.items():
        print(f"{name}: what held the loop (pipeline/run/loop_watch.py; count, total ms, longest ms): "
              + ("; ".join(f"{r['name']} {r['count']} {r['total_ms']:.0f} {r['longest_ms']:.1f}" for r in rows[:5]) or "nothing"))
    for name, peaks in phases.items():
        print(f"{name}: peak RSS so far at the end of each phase (MB): " + (", ".join(f"{p} {mb:.0f}" for p, mb in peaks.items()) or "n/a"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
