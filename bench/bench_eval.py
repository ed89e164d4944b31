"""Held-out evaluation cost, measured side by side in one run (no asserts).

    .venv/bin/python bench/bench_eval.py [--tasks 200] [--max-batch 64 128] [--range dev] [--set key=value ...]

Builds the configured policy (the warm start comes from the cache when it exists; its training time is
not measured), then evaluates the first `--tasks` tasks of the `--range` (dev by default) of every `eval.splits`
split, greedy:

* `per split, 64 at a time`: the evaluation before `evaluate_splits` (one split after the other,
  `evaluate(..., concurrency=64)` each);
* `all splits at once`: `evaluate_splits`, every episode of every split concurrently through the
  batching policy, for each `--max-batch` (`policy.max_batch`, the most requests decoded together).

Prints wall seconds, process CPU seconds, policy batches and the success per split for each (behind decoding
workers, `policy.workers` > 1: CPU is this process's alone and batches are "-", each worker batching), so the
ratios are read from one run (a busy machine slows every row alike). Greedy episodes are deterministic,
so every row must show the same success; a difference would be a bug.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.progress import Progress  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from pipeline.task_ranges import RANGES, task_range  # noqa: E402
from stages.evaluate import evaluate, evaluate_splits  # noqa: E402


def _batches(policy) -> int | None:  # noqa: ANN001
    """Batches decoded so far; None behind decoding workers (`policy.workers` > 1: each worker batches)."""
    return policy.statistics().batches


async def _timed(policy, run) -> tuple[dict, float, float, int | None]:  # noqa: ANN001
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        batches = _batches(policy)
        wall, cpu = time.perf_counter(), time.process_time()
        reports = await run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        after = _batches(policy)
        batches = after - batches if after is not None and batches is not None else None
        nursery.cancel_scope.cancel()
    return {split: r.success for split, r in reports.items()}, wall, cpu, batches


async def main(args: argparse.Namespace) -> None:
    cfg = load(args.config, args.set)
    Progress(0, enabled=args.progress).activate()
    suite = build.suite(cfg)
    splits = {split: task_range(suite.tasks(split), args.range, cfg.eval.sizes(), args.tasks) for split in cfg.eval.splits}
    rows = []

    async def per_split(policy) -> dict:  # noqa: ANN001
        return {s: await evaluate(policy, suite, tasks, concurrency=64) for s, tasks in splits.items()}

    base = await trio.to_thread.run_sync(build.policy, cfg, suite)
    rows.append((f"per split, 64 at a time (max_batch {cfg.policy.max_batch})", *await _timed(base, lambda: per_split(base))))
    for max_batch in args.max_batch:
        cfg_b = msgspec.structs.replace(cfg, policy=msgspec.structs.replace(cfg.policy, max_batch=max_batch))
        policy = await trio.to_thread.run_sync(build.policy, cfg_b, suite)
        rows.append(
            (f"all splits at once (max_batch {max_batch})",
             *await _timed(policy, lambda p=policy: evaluate_splits(p, suite, splits)))
        )
    n = sum(map(len, splits.values()))
    print(f"\nheld-out evaluation, {n} greedy episodes ({args.tasks} per split, {args.range} range), policy {cfg.policy.backend}")
    print("| evaluation | wall s | CPU s | batches | " + " | ".join(splits) + " | wall vs first |")
    print("|---|---|---|---|" + "---|" * len(splits) + "---|")
    for name, success, wall, cpu, batches in rows:
        figures = " | ".join(f"{success[s]:.1%}" for s in splits)
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {'-' if batches is None else batches} | {figures} | {wall / rows[0][2]:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--range", default="dev", choices=RANGES, help="the held-out task range (default: dev)")
    parser.add_argument("--max-batch", type=int, nargs="*", default=[64])
    parser.add_argument("--set", action="append", default=[], help="config override key=value (repeatable)")
    parser.add_argument("--progress", action="store_true", help="show evaluation progress on stderr")
    trio.run(main, parser.parse_args())
