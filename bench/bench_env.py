"""Household environment throughput: env steps per second on one core, admissible commands included.

Runs a random-admissible policy over train tasks (reset cost included, policy cost excluded as far as
possible: one `random.choice` per step) and prints steps/s against the goal of 20,000, plus reset and
task-generation timings. Usage: `python bench/bench_env.py [--steps N] [--max-steps T]`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.envs.household import HouseholdSuite  # noqa: E402

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--max-steps", type=int, default=30)
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


if __name__ == "__main__":
    main()
