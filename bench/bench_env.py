"""Household environment throughput: env steps per second on one core, admissible commands included.

Runs a random-admissible policy over train tasks (reset cost included, policy cost excluded as far as
possible: one `random.choice` per step) and prints steps/s against the goal of 20,000 and the time to
generate the train split. `--families` also prints, per split and family, the random-admissible success
rate and the expert's mean plan length (the difficulty table of docs/environments.md).
Usage: `python bench/bench_env.py [--steps N] [--max-steps T] [--families]`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.envs.base import SPLITS  # noqa: E402
from stages.envs.household import HouseholdSuite  # noqa: E402
from stages.envs.household.catalog import FAMILIES  # noqa: E402

GOAL_STEPS_PER_S = 20_000


def measure(suite: HouseholdSuite, steps: int, seed: int = 0) -> tuple[float, int, int]:
    """Seconds for `steps` random-admissible steps, the number of episodes and of wins."""
    tasks = suite.tasks("train")
    env = suite.make()
    rng = random.Random(seed)
    choice = rng.choice
    episodes = wins = done_steps = 0
    start = time.perf_counter()
    while done_steps < steps:
        observation = env.reset(tasks[episodes % len(tasks)])
        episodes += 1
        admissible = observation.admissible
        while True:
            result = env.step(choice(admissible))
            done_steps += 1
            if result.done:
                wins += result.won
                break
            admissible = result.observation.admissible
    return time.perf_counter() - start, episodes, wins


def family_table(suite: HouseholdSuite, tasks_per_split: int, episodes: int, seed: int = 0) -> str:
    """Markdown table: per split and family, random-admissible success and expert plan length."""
    rng = random.Random(seed)
    env = suite.make()
    rows = ["| split | family | tasks | random success | expert steps (mean, min-max) |", "| --- | --- | --- | --- | --- |"]
    for split in SPLITS:
        wins: dict[str, list[bool]] = defaultdict(list)
        lengths: dict[str, list[int]] = defaultdict(list)
        for task in suite.tasks(split)[:tasks_per_split]:
            lengths[task.family].append(len(suite.expert(task)))
            for _ in range(episodes):
                admissible = env.reset(task).admissible
                while True:
                    result = env.step(rng.choice(admissible))
                    if result.done:
                        break
                    admissible = result.observation.admissible
                wins[task.family].append(result.won)
        for family in FAMILIES:
            if lengths[family]:
                steps = lengths[family]
                rows.append(
                    f"| {split} | {family} | {len(steps)} | {statistics.mean(wins[family]):.1%} | "
                    f"{statistics.mean(steps):.1f} ({min(steps)}-{max(steps)}) |"
                )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--families", action="store_true", help="also print the per-family difficulty table")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    suite = HouseholdSuite(max_steps=args.max_steps)
    suite.tasks("train")
    generation_s = time.perf_counter() - start

    measure(suite, 20_000)  # warm the per-layout caches
    seconds, episodes, wins = measure(suite, args.steps)
    rate = args.steps / seconds
    print(f"train split generation: {generation_s:.2f} s for {len(suite.tasks('train'))} tasks")
    print(
        f"env steps/s: {rate:,.0f} ({args.steps:,} steps, {episodes:,} episodes incl. reset, "
        f"random-admissible success {wins / episodes:.1%})"
    )
    print(f"goal {GOAL_STEPS_PER_S:,} steps/s: ratio {rate / GOAL_STEPS_PER_S:.2f}x "
          f"({'met' if rate >= GOAL_STEPS_PER_S else 'MISSED'})")
    if args.families:
        print(family_table(suite, tasks_per_split=600, episodes=5))


if __name__ == "__main__":
    main()
