"""What encoding a repeated prompt once saves, on the rollouts of a real warm start.

    .venv/bin/python bench/bench_repeated_prompts.py --config configs/learn.toml [--groups 16] [--set key=value ...]

Rollouts of one group that act alike reach the same state with the same history, so their prompts (and
admissible commands) repeat: at T = 0.5 the learn preset's warm start repeats many. With whole-command
choice (`choose_by = "command"`) every turn costs one packed forward of its prompt and commands, and
`command_scores` encodes a repeated (prompt, commands) row once (`_commands.distinct_rows`).

The bench plays `--groups` train tasks (the last of the split) 8 times each at the policy's temperature,
in lockstep (`stages.lockstep`), recording every turn, then times one torch thread, best of `--repeat`,
each pair interleaved:

* **learner**: forward + backward of every turn's chosen command in micro-batches of `learner.micro_batch`,
  (a) turns in plain random order, every row encoded, against (b) the trainer's order
  (`learner.items.shuffled_by_prompt`: turns sharing a prompt side by side) through `command_scores`;
* **decoding**: scoring each lockstep step's batch (chunks of `policy.max_batch`, a group's rollouts side by
  side: the policy server's batches mix groups as requests arrive, so this is the most its batches can save),
  every row encoded against `command_scores`.

Prints the share of distinct rows and the seconds and ratio of each.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner.items import TrainItem, shuffled_by_prompt  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from stages.lockstep import play_lockstep  # noqa: E402
from stages.policy.base import AgentContext  # noqa: E402
from stages.policy.torch_tiny._commands import command_scores, distinct_rows, every_row_scores  # noqa: E402
from stages.policy.torch_tiny._pretrain import _decode  # noqa: E402
from stages.policy.torch_tiny._prompt import parse_action  # noqa: E402
from stages.policy.torch_tiny._server import request_uniforms  # noqa: E402

Rows = list[tuple[list[int], list[list[int]], int]]
"""(prompt, commands, index of the chosen command) per turn."""


def play(policy, suite, tasks, seed: int) -> tuple[Rows, list[Rows]]:
    """Every turn of 8 rollouts per task, and the turns of each lockstep step."""
    fmt, sampling, model = policy.prompt, policy.sampling, policy.model
    runs = [task for task in tasks for _ in range(8)]
    turns: Rows = []
    steps: list[Rows] = []

    def decide(step: int, live: list[int], contexts: list[AgentContext], envs) -> list[str]:
        prompts = [fmt.build(c) for c in contexts]
        uniforms = torch.stack([request_uniforms(seed, i * suite.max_steps + step, sampling.max_new_tokens) for i in live])
        with torch.no_grad():
            samples = _decode(model, fmt, sampling, prompts, uniforms, False, [c.admissible for c in contexts])
        rows = []
        for prompt, context, sample in zip(prompts, contexts, samples, strict=True):
            options = sampling.choices(fmt, context.admissible)
            rows.append((prompt, options, options.index(sample.token_ids)))
        steps.append(rows)
        turns.extend(rows)
        return [
            parse_action(fmt.tokenizer.decode(s.token_ids), c.admissible, fuzzy_cutoff=sampling.fuzzy_cutoff)
            for c, s in zip(contexts, samples, strict=True)
        ]

    play_lockstep(suite, runs, decide, label="rollouts")
    return turns, steps


def chosen_sum(score: Callable, model, rows: Rows) -> torch.Tensor:
    scores = score(model, [r[0] for r in rows], [r[1] for r in rows])  # [n, K]
    return scores.gather(1, torch.tensor([[r[2]] for r in rows])).sum()


def best_of(repeat: int, runs: dict[str, Callable[[], None]]) -> dict[str, float]:
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def distinct_share(rows: Sequence[tuple[list[int], list[list[int]], int]]) -> float:
    first, _ = distinct_rows([r[0] for r in rows], [r[1] for r in rows])
    return len(first) / max(1, len(rows))


def main(args: argparse.Namespace) -> None:
    cfg = load(args.config, args.set)
    Progress(0).activate()
    suite = build.suite(cfg)
    policy = build.policy(cfg, suite, workers=1)  # scored in this process, whatever policy.workers says
    if not (policy.sampling.choose_admissible and policy.model.choose_by == "command"):
        sys.exit("bench_repeated_prompts: needs policy.options choose_admissible = true and choose_by = \"command\"")
    torch.set_num_threads(1)
    tasks = list(suite.tasks("train"))[-args.groups :]
    turns, steps = play(policy, suite, tasks, cfg.run.seed)
    model = policy.model.requires_grad_(True)
    micro = cfg.learner.micro_batch
    items = [TrainItem(p, c[j], [0.0], 1.0, i, 0, True, c) for i, (p, c, j) in enumerate(turns)]
    rng = random.Random(cfg.run.seed)
    plain = [turns[it.trajectory] for it in rng.sample(items, len(items))]
    grouped = [turns[it.trajectory] for it in shuffled_by_prompt(items, rng)]

    def learner(order: Rows, score: Callable) -> Callable[[], None]:
        def run() -> None:
            model.zero_grad(set_to_none=True)
            for lo in range(0, len(order), micro):
                chosen_sum(score, model, order[lo : lo + micro]).backward()
        return run

    def decoding(score: Callable) -> Callable[[], None]:
        def run() -> None:
            with torch.inference_mode():
                for rows in steps:
                    for lo in range(0, len(rows), policy.sampling.max_batch):
                        chosen_sum(score, model, rows[lo : lo + policy.sampling.max_batch])
        return run

    learn = best_of(args.repeat, {"every row": learner(plain, every_row_scores), "repeats once": learner(grouped, command_scores)})
    decode = best_of(args.repeat, {"every row": decoding(every_row_scores), "repeats once": decoding(command_scores)})
    in_batches = [distinct_share(rows[lo : lo + policy.sampling.max_batch]) for rows in steps
                  for lo in range(0, len(rows), policy.sampling.max_batch)]
    in_micro = [distinct_share(grouped[lo : lo + micro]) for lo in range(0, len(grouped), micro)]
    print(f"\n{len(tasks)} tasks x 8 rollouts at T = {policy.sampling.temperature}: {len(turns)} turns, "
          f"{distinct_share(turns):.2f} of them distinct (prompt, commands) rows")
    print("| pass | distinct rows per batch (mean) | every row encoded s | repeats encoded once s | ratio |\n|---|---|---|---|---|")
    for name, times, shares in (("learner forward + backward", learn, in_micro), ("decoding, lockstep batches", decode, in_batches)):
        print(f"| {name} | {sum(shares) / len(shares):.2f} | {times['every row']:.2f} | {times['repeats once']:.2f} | "
              f"{times['repeats once'] / times['every row']:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/learn.toml")
    parser.add_argument("--groups", type=int, default=16, help="train tasks, 8 rollouts each")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    main(parser.parse_args())
