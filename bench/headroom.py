"""Is there headroom RL can take? pass@k against greedy, and imitation of the warm start's own successes.

    .venv/bin/python bench/headroom.py [--config configs/learn.toml] [--tasks 50] [--temperatures 0.7 1.0]
        [--imitate-tasks 300] [--imitate-epochs 2] [--imitate-lr 1e-3] [--range dev] [--set key=value ...]

Builds the configured torch_tiny policy (cached warm start, else behaviour cloning), then, in lockstep:

1. greedy success on the first `--tasks` tasks of each held-out split's `--range` (dev: a probe is tuning);
2. per temperature, G = 8 samples of each of those tasks: mean success, pass@8 and how many tasks were won
   0..8 times. pass@8 far above greedy means the policy *can* win tasks it does not win greedily;
3. with `--imitate-tasks` N > 0, the upper-bound probe: sample G = 8 episodes of N train tasks (after
   the demonstrations) at the first temperature, behaviour-clone the won ones (their prompts rebuilt by
   replaying the actions), and measure greedy held-out success again on `--eval-tasks` per split. That is
   what a positive-only learner could reach with that data in one step: if it does not lift greedy
   success, the policy's wins are luck its prompt cannot tell apart from its losses, and GRPO on the same
   rollouts has nothing to sharpen either (docs/learning.md, "Headroom").
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.progress import Progress  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from pipeline.task_ranges import RANGES, task_range  # noqa: E402
from stages.envs.base import EnvSuite, Task  # noqa: E402
from stages.policy.base import AgentContext  # noqa: E402
from stages.policy.torch_tiny._pretrain import Demo, pack_episode, rollout_lockstep, train_bc  # noqa: E402
from stages.policy.torch_tiny._prompt import PromptFormat  # noqa: E402

G = 8


def replay(suite: EnvSuite, fmt: PromptFormat, task: Task, actions: Sequence[str]) -> list[Demo]:
    """The (prompt, action) steps of an episode, rebuilt by playing `actions` again (the env is deterministic)."""
    env = suite.make()
    try:
        obs = env.reset(task)
        history: list[tuple[str, str]] = []
        steps: list[Demo] = []
        for action in actions:
            ctx = AgentContext(task.description, obs.text, obs.admissible, tuple(history))
            steps.append(Demo(fmt.build(ctx), fmt.completion(action)))
            history.append((obs.text, action))
            obs = env.step(action).observation
        return steps
    finally:
        env.close()


def main(args: argparse.Namespace) -> None:
    cfg = load(args.config, args.set)
    Progress(0).activate()
    torch.set_num_threads(args.threads)
    suite = build.suite(cfg)
    policy = build.policy(cfg, suite, workers=1)  # scored in this process, whatever policy.workers says
    model, fmt, sampling = policy.model, policy.prompt, policy.sampling

    def held_out(n: int) -> list[Task]:
        return [t for split in ("heldout_seen", "heldout_unseen") for t in task_range(suite.tasks(split), args.range, cfg.eval.sizes(), n)]

    def greedy(n: int) -> float:
        episodes = rollout_lockstep(model, fmt, suite, held_out(n), sampling, greedy=True, seed=cfg.run.seed)
        return sum(e.won for e in episodes) / len(episodes)

    tasks = held_out(args.tasks)
    print(f"greedy success on {len(tasks)} held-out tasks ({args.range} range): {greedy(args.tasks):.3f}")
    print("| temperature | mean success | pass@8 | tasks won 0..8 of 8 times | s |")
    print("|---|---|---|---|---|")
    for temperature in args.temperatures:
        started = time.perf_counter()
        sampled = rollout_lockstep(model, fmt, suite, tasks, dataclasses.replace(sampling, temperature=temperature),
                                   samples=G, greedy=False, seed=cfg.run.seed + 1)
        wins = [sum(e.won for e in sampled[i * G : (i + 1) * G]) for i in range(len(tasks))]
        counts = Counter(wins)
        print(f"| {temperature} | {sum(wins) / (G * len(tasks)):.3f} | {sum(w > 0 for w in wins) / len(tasks):.3f} "
              f"| {' / '.join(str(counts[k]) for k in range(G + 1))} | {time.perf_counter() - started:.0f} |")
    if args.imitate_tasks <= 0:
        return
    before = greedy(args.eval_tasks)
    train = list(suite.tasks("train"))[cfg.pretrain.demos : cfg.pretrain.demos + args.imitate_tasks]
    temperature = args.temperatures[0]
    played = rollout_lockstep(model, fmt, suite, train, dataclasses.replace(sampling, temperature=temperature),
                              samples=G, greedy=False, seed=cfg.run.seed + 2, label="own episodes")
    won = [e for e in played if e.won]
    packs = [p for e in won for p in pack_episode(replay(suite, fmt, e.task, e.actions))]
    model.requires_grad_(True)
    started = time.perf_counter()
    train_bc(model, packs, epochs=args.imitate_epochs, lr=args.imitate_lr, batch_size=cfg.pretrain.batch_size,
             seed=cfg.run.seed, label="imitating own wins")
    model.requires_grad_(False)
    after = greedy(args.eval_tasks)
    print(f"\nimitation of own wins: {len(won)} of {len(played)} episodes of {len(train)} train tasks at T = {temperature}, "
          f"{sum(p.steps for p in packs)} steps, {args.imitate_epochs} epochs at lr {args.imitate_lr} "
          f"({time.perf_counter() - started:.0f} s): greedy held-out success ({args.eval_tasks} tasks per split) "
          f"{before:.3f} -> {after:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/learn.toml")
    parser.add_argument("--tasks", type=int, default=50, help="held-out tasks per split for greedy and pass@8")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0])
    parser.add_argument("--imitate-tasks", type=int, default=0, help="train tasks for the imitation probe (0 = skip)")
    parser.add_argument("--imitate-epochs", type=int, default=2)
    parser.add_argument("--imitate-lr", type=float, default=1e-3)
    parser.add_argument("--eval-tasks", type=int, default=200, help="held-out tasks per split around the imitation")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--range", default="dev", choices=RANGES, help="the held-out task range probed (default: dev)")
    parser.add_argument("--set", action="append", default=[], help="config override key=value (repeatable)")
    main(parser.parse_args())
