"""What `learner.skip_confident` saves on the rollouts of a real warm start, and what it changes.

    .venv/bin/python bench/bench_skip_confident.py --config configs/learn.toml [--groups 32] [--p 0.99] [--set key=value ...]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_skip_confident.py --config configs/smollm2-choose.toml --groups 8 --repeat 1

A sharp warm start acts with probability ~1 on most turns: with whole-command choice at T = 0.5 and top-p
0.95 the chosen command is often the only one in the nucleus (probability exactly 1, no gradient at all).
A turn's policy-gradient term scales with 1 - p, so leaving those turns out of the learner's passes should
cost the update almost nothing and save their forward / backward compute.

The bench plays `--groups` train tasks (the last of the split) 8 times each at the policy's temperature,
all at once through `policy.act` (any backend), recording every turn as the rollout stage does (prompt,
chosen command, its log-probs under the sampling distribution, the commands on offer), keeps the mixed groups (the learner refuses the
others), and runs one learner update on them from the same weights with `learner.skip_confident` = 0 and
= `--p`, interleaved, best of `--repeat`, one torch thread. Prints the share of turns skipped, the seconds
and their ratio, and the cosine between the two updates' first-step gradients (1 = the same direction)
with the ratio of their norms.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec
import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.trainer import Trainer  # noqa: E402
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus  # noqa: E402
from pipeline.progress import Progress, report  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from stages.envs.base import EnvSuite, Task  # noqa: E402
from stages.episode import Episode, play_episode  # noqa: E402
from stages.policy.base import Policy  # noqa: E402


def play_groups(policy: Policy, suite: EnvSuite, tasks: Sequence[Task], group_size: int = 8) -> list[GroupResult]:
    """`group_size` rollouts per task at the policy's sampling settings, through `policy.act` as the rollout
    stage plays them (any backend; every episode at once, so a batching policy scores them together), every
    turn recorded; one group per task, in the order of `tasks`."""
    runs = [(g, task) for g, task in enumerate(tasks) for _ in range(group_size)]
    episodes: list[Episode] = [Episode() for _ in runs]
    finished = won = 0

    async def one(i: int) -> None:
        nonlocal finished, won
        env = suite.make()
        try:
            await play_episode(policy, env, runs[i][1], suite.max_steps, episode=episodes[i])
        finally:
            env.close()
        finished, won = finished + 1, won + episodes[i].won
        report("rollouts", finished, len(runs), f"{won} won")

    async def play() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(policy.serve)
            async with trio.open_nursery() as games:
                for i in range(len(runs)):
                    games.start_soon(one, i)
            nursery.cancel_scope.cancel("rollouts finished")

    trio.run(play)
    groups = []
    for g, task in enumerate(tasks):
        played = episodes[g * group_size : (g + 1) * group_size]
        trajectories = [
            Trajectory(rollout_index=k, turns=e.turns, reward=float(e.won), success=e.won, status=TrajectoryStatus.COMPLETE)
            for k, e in enumerate(played)
        ]
        groups.append(GroupResult(group_id=g, task_id=task.task_id, trajectories=trajectories, cut=False))
    return groups


def timed_update(trainer: Trainer, groups: list[GroupResult]) -> tuple[float, dict[str, float], torch.Tensor]:
    """One update: its seconds, its figures and the flattened gradient of its first optimizer step (copied as
    the step is taken; the copy is the only work added to the timed update)."""
    captured: list[torch.Tensor] = []
    step = trainer.optimizer.step

    def capture() -> None:
        if not captured:
            captured.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
        step()

    trainer.optimizer.step = capture  # type: ignore[method-assign,assignment]
    try:
        started = time.perf_counter()
        _, stats = trainer.update(groups)
        seconds = time.perf_counter() - started
    finally:
        trainer.optimizer.step = step  # type: ignore[method-assign]
    return seconds, stats, captured[0]


def main(args: argparse.Namespace) -> None:
    cfg = load(args.config, args.set)
    Progress(0).activate()
    suite = build.suite(cfg)
    policy = build.policy(cfg, suite, workers=1)  # scored in this process, whatever policy.workers says
    torch.set_num_threads(1)
    tasks = list(suite.tasks("train"))[-args.groups :]
    played = play_groups(policy, suite, tasks)
    groups = [g for g in played if 0 < sum(t.success for t in g.trajectories) < len(g.trajectories)]
    if not groups:
        sys.exit("bench_skip_confident: no mixed group among the rollouts; play more --groups")
    model = policy.trainable()  # the learner's copy of the served weights (hf / vLLM: with the LoRA adapter)
    weights = copy.deepcopy(model.state_dict())
    arms = {"every turn": 0.0, f"skip p >= {args.p}": args.p}

    def trainer(skip: float) -> Trainer:
        model.load_state_dict(weights)  # type: ignore[attr-defined]  # every backend's trainable model has one
        return build.trainer(msgspec.structs.replace(cfg, learner=msgspec.structs.replace(cfg.learner, skip_confident=skip)), model)

    best = dict.fromkeys(arms, float("inf"))
    gradients: dict[str, torch.Tensor] = {}
    skipped = 0.0
    for _ in range(args.repeat):
        for name, skip in arms.items():
            seconds, stats, gradients[name] = timed_update(trainer(skip), groups)
            best[name] = min(best[name], seconds)
            skipped = stats["learner/skipped_confident"] if skip else skipped
    policy.close()
    every, skipping = gradients.values()
    cosine = float(torch.nn.functional.cosine_similarity(every.double(), skipping.double(), dim=0))
    turns = sum(len(t.turns) for g in groups for t in g.trajectories)
    certain = sum(sum(u.logprobs) == 0.0 for g in groups for t in g.trajectories for u in t.turns)
    print(f"\n{len(tasks)} tasks x 8 rollouts at T = {cfg.policy.temperature}, top-p {cfg.policy.top_p}: "
          f"{len(groups)} mixed groups, {turns} turns; minibatch_items {cfg.learner.minibatch_items}, epochs {cfg.learner.epochs}")
    print(f"{certain / turns:.2f} of the turns had probability exactly 1 (one command in the top-p nucleus)")
    print("| turns skipped | update s, every turn | update s, skipping | ratio | first-step gradient cosine | norm ratio |")
    print("|---|---|---|---|---|---|")
    names = list(arms)
    print(f"| {skipped:.2f} | {best[names[0]]:.2f} | {best[names[1]]:.2f} | {best[names[1]] / best[names[0]]:.2f} | "
          f"{cosine:.4f} | {float(skipping.norm() / every.norm()):.4f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/learn.toml")
    parser.add_argument("--groups", type=int, default=32, help="train tasks, 8 rollouts each")
    parser.add_argument("--p", type=float, default=0.99, help="the skip_confident probability to compare against 0")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    main(parser.parse_args())
