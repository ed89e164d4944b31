"""What `learner.skip_confident` saves on the rollouts of a real warm start, and what it changes.

    .venv/bin/python bench/bench_skip_confident.py --config configs/learn.toml [--groups 32] [--p 0.99] [--set key=value ...]

A sharp warm start acts with probability ~1 on most turns: with whole-command choice at T = 0.5 and top-p
0.95 the chosen command is often the only one in the nucleus (probability exactly 1, no gradient at all).
A turn's policy-gradient term scales with 1 - p, so leaving those turns out of the learner's passes should
cost the update almost nothing and save their forward / backward compute.

The bench plays `--groups` train tasks (the last of the split) 8 times each at the policy's temperature,
in lockstep, recording every turn as the rollout stage would (prompt, chosen command, its log-probs under
the sampling distribution, the commands on offer), keeps the mixed groups (the learner refuses the
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
from pathlib import Path

import msgspec
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.trainer import Trainer  # noqa: E402
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus, Turn  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from stages.lockstep import play_lockstep  # noqa: E402
from stages.policy.base import AgentContext  # noqa: E402
from stages.policy.torch_tiny._pretrain import _decode  # noqa: E402
from stages.policy.torch_tiny._prompt import parse_action  # noqa: E402
from stages.policy.torch_tiny._server import request_uniforms  # noqa: E402


def play_groups(policy, suite, tasks, seed: int) -> list[GroupResult]:
    """8 rollouts per task at the policy's sampling settings, every turn recorded; one group per task."""
    fmt, sampling, model = policy.prompt, policy.sampling, policy.model
    runs = [task for task in tasks for _ in range(8)]
    turns: list[list[Turn]] = [[] for _ in runs]

    def decide(step: int, live: list[int], contexts: list[AgentContext], envs) -> list[str]:
        prompts = [fmt.build(c) for c in contexts]
        uniforms = torch.stack([request_uniforms(seed, i * suite.max_steps + step, sampling.max_new_tokens) for i in live])
        with torch.no_grad():
            samples = _decode(model, fmt, sampling, prompts, uniforms, False, [c.admissible for c in contexts])
        actions = []
        for i, prompt, context, sample in zip(live, prompts, contexts, samples, strict=True):
            action = parse_action(fmt.tokenizer.decode(sample.token_ids), context.admissible, fuzzy_cutoff=sampling.fuzzy_cutoff)
            choices = sampling.choices(fmt, context.admissible) if sampling.choose_admissible else []
            turns[i].append(Turn(prompt_ids=prompt, token_ids=sample.token_ids, logprobs=sample.logprobs, action=action,
                                 policy_version=0, choices=choices, nucleus=sample.nucleus))
            actions.append(action)
        return actions

    episodes = play_lockstep(suite, runs, decide, label="rollouts")
    groups = []
    for g, task in enumerate(tasks):
        trajectories = [
            Trajectory(rollout_index=k, turns=turns[g * 8 + k], reward=float(e.won), success=e.won, status=TrajectoryStatus.COMPLETE)
            for k, e in enumerate(episodes[g * 8 : g * 8 + 8])
        ]
        groups.append(GroupResult(group_id=g, task_id=task.task_id, trajectories=trajectories, cut=False))
    return groups


def first_step_gradient(trainer: Trainer, groups: list[GroupResult]) -> torch.Tensor:
    """The flattened gradient of the update's first optimizer step (the weights are left as they were)."""
    captured: list[torch.Tensor] = []
    step = trainer.optimizer.step

    def capture() -> None:
        if not captured:
            captured.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))

    trainer.optimizer.step = capture  # type: ignore[method-assign]
    try:
        trainer.update(groups)
    finally:
        trainer.optimizer.step = step  # type: ignore[method-assign]
    return captured[0]


def main(args: argparse.Namespace) -> None:
    cfg = load(args.config, args.set)
    Progress(0).activate()
    suite = build.suite(cfg)
    policy = build.policy(cfg, suite, workers=1)  # scored in this process, whatever policy.workers says
    torch.set_num_threads(1)
    tasks = list(suite.tasks("train"))[-args.groups :]
    played = play_groups(policy, suite, tasks, cfg.run.seed)
    groups = [g for g in played if 0 < sum(t.success for t in g.trajectories) < len(g.trajectories)]
    if not groups:
        sys.exit("bench_skip_confident: no mixed group among the rollouts; play more --groups")
    model = policy.model.requires_grad_(True)
    weights = copy.deepcopy(model.state_dict())
    arms = {"every turn": 0.0, f"skip p >= {args.p}": args.p}

    def trainer(skip: float) -> Trainer:
        model.load_state_dict(weights)
        return build.trainer(msgspec.structs.replace(cfg, learner=msgspec.structs.replace(cfg.learner, skip_confident=skip)), model)

    best = dict.fromkeys(arms, float("inf"))
    skipped = 0.0
    for _ in range(args.repeat):
        for name, skip in arms.items():
            t = trainer(skip)
            started = time.perf_counter()
            _, stats = t.update(groups)
            best[name] = min(best[name], time.perf_counter() - started)
            skipped = stats["learner/skipped_confident"] if skip else skipped
    every, skipping = (first_step_gradient(trainer(skip), groups) for skip in arms.values())
    cosine = float(torch.nn.functional.cosine_similarity(every.double(), skipping.double(), dim=0))
    turns = sum(len(t.turns) for g in groups for t in g.trajectories)
    certain = sum(sum(u.logprobs) == 0.0 for g in groups for t in g.trajectories for u in t.turns)
    print(f"\n{len(tasks)} tasks x 8 rollouts at T = {policy.sampling.temperature}, top-p {policy.sampling.top_p}: "
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
