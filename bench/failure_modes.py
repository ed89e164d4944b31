"""Why does a household policy fail, and did RL change it? Failure kinds and two decision probes.

    .venv/bin/python bench/failure_modes.py [--config configs/learn.toml] [--tasks 100] [--sample] [--range dev]
        [--set key=value ...] [WEIGHTS.pt ...]

Builds the configured torch_tiny policy (cached warm start, else behaviour cloning), then, in lockstep
with the first `--tasks` tasks of each held-out split's `--range` (dev by default: a probe is tuning):

1. for the warm start and each WEIGHTS file (a run's `checkpoints/policy.pt`): episodes played greedily
   (`--sample`: at the policy's temperature / top-p), won, and each lost episode's kind: whether it ever
   saw or took a goal object, and whether it took an object of another kind ("took wrong"); a loss after
   taking a goal object also says the first step of the goal it then missed (`after_take`); the mean
   number of distinct receptacles a lost episode went to (a looping agent goes back and forth between
   two or three);
2. the two decisions behind most losses, probed at the first `--probe-states` states of each kind of the
   warm start's greedy episodes:
   * P(take wrong): hands empty, objects in reach, none of the goal's kind: the probability (T = 1, over
     the admissible commands) of taking one of them;
   * P(go back): the agent chose to go somewhere and could go back to a receptacle it already visited:
     the probability of going back.

A learner that helps should lower both. Household only: the kinds come from the task's goal object.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.progress import Progress  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from pipeline.task_ranges import RANGES, task_range  # noqa: E402
from stages.envs.household.engine import REQUIRED_STATE  # noqa: E402
from stages.envs.household.expert import search_order  # noqa: E402
from stages.policy.base import AgentContext  # noqa: E402
from stages.policy.torch_tiny import TinyLM  # noqa: E402
from stages.policy.torch_tiny._pretrain import LabelledEpisode, rollout_lockstep  # noqa: E402


@dataclass(frozen=True, slots=True)
class Decision:
    """A state of a probe: the prompt, the admissible completions, and which of them are the bad ones."""

    prompt: list[int]
    choices: list[list[int]]
    bad: list[int]


def _kind(name: str) -> str:
    return name.split(" ", 1)[0]


def after_take(spec, actions: Sequence[str]) -> str:
    """The first step of the goal missing from `actions`, the commands after the episode first took a goal
    object: its transform (clean / heat / cool), the lamp, going to the target receptacle, putting it there
    (and, for pick_two, the second one); "put it there, still lost" when none is missing (e.g. put there
    before the transform, which does not count)."""
    verb = spec.family.split("_")[1] if spec.family in REQUIRED_STATE else None  # pick_clean_then_place: clean
    if verb is not None and not any(a.startswith(verb + " ") for a in actions):
        return f"never {verb}ed it"
    if spec.target < 0:
        return "never used the lamp" if not any(a.startswith("use ") for a in actions) else "used the lamp, still lost"
    target = spec.layout.names[spec.target]
    if f"go to {target}" not in actions:
        return "never took it to the target"
    there = [a for a in actions if a.startswith("put ") and a.endswith(" " + target)]
    if not there:
        return "put it elsewhere" if any(a.startswith("put ") for a in actions) else "at the target, never put it"
    if len(there) < spec.goal_count:
        return "put one of two there"
    return "put it there, still lost"


def classify(suite, episodes: Sequence[LabelledEpisode]) -> tuple[int, Counter, list[int]]:
    """(episodes won, Counter of failure kinds, distinct receptacles gone to per lost episode)."""
    kinds: Counter = Counter()
    distinct: list[int] = []
    won = 0
    for episode in episodes:
        spec = suite.spec(episode.task)
        env = suite.make()
        env.reset(episode.task)
        took_goal = took_wrong = False
        first_goal_take = -1
        targets: set[str] = set()
        for step, action in enumerate(episode.actions):
            if action.startswith("take "):
                goal = _kind(action[5:]) == spec.goal_kind
                if goal and not took_goal:
                    first_goal_take = step
                took_goal |= goal
                took_wrong |= not goal
            if action.startswith("go to "):
                targets.add(action[6:])
            if env.step(action).done:
                break
        if episode.won:
            won += 1
            continue
        world = env.world()
        saw_goal = took_goal or any(
            world.looked[rec] and any(_kind(world.names[obj]) == spec.goal_kind for obj in world.contents[rec])
            for rec in search_order(spec)
        )
        kind = (f"took a goal object ({after_take(spec, episode.actions[first_goal_take + 1 :])})" if took_goal
                else "saw a goal object, never took it" if saw_goal else "never saw a goal object")
        kinds[kind + (", took a wrong one" if took_wrong else "")] += 1
        distinct.append(len(targets))
    return won, kinds, distinct


def decisions(suite, fmt, episodes: Sequence[LabelledEpisode]) -> tuple[list[Decision], list[Decision]]:
    """The take-wrong and go-back states of `episodes` (see the module doc)."""
    take_wrong: list[Decision] = []
    go_back: list[Decision] = []
    for episode in episodes:
        spec = suite.spec(episode.task)
        env = suite.make()
        obs = env.reset(episode.task)
        history: list[tuple[str, str]] = []
        visited: set[str] = set()
        for action in episode.actions:
            held = env.world().held >= 0
            commands = obs.admissible
            takes = [i for i, c in enumerate(commands) if c.startswith("take ")]
            wrong = [i for i in takes if _kind(commands[i][5:]) != spec.goal_kind]
            back = [i for i, c in enumerate(commands) if c.startswith("go to ") and c[6:] in visited]
            for probe, bad in ((take_wrong, wrong if len(wrong) == len(takes) else []),
                               (go_back, back if action.startswith("go to ") else [])):
                if bad and not held:
                    context = AgentContext(episode.task.description, obs.text, commands, tuple(history))
                    probe.append(Decision(fmt.build(context), [fmt.completion(c) for c in commands], bad))
            if action.startswith("go to "):
                visited.add(action[6:])
            result = env.step(action)
            history.append((obs.text, action))
            obs = result.observation
            if result.done:
                break
    return take_wrong, go_back


def bad_mass(model: TinyLM, states: Sequence[Decision], chunk: int = 256) -> float:
    """Mean probability of the bad commands (T = 1, over each state's admissible commands)."""
    if not states:
        return float("nan")
    rows = [(state.prompt, c, state.choices) for state in states for c in state.choices]
    totals: list[float] = []
    with torch.no_grad():
        for start in range(0, len(rows), chunk):
            prompts, completions, choices = zip(*rows[start : start + chunk], strict=True)
            scores = model.completion_logprobs(prompts, completions, choices=choices)
            totals += (scores.logprobs * scores.mask).sum(-1).exp().tolist()  # [rows]
    out, at = [], 0
    for state in states:
        p = torch.tensor(totals[at : at + len(state.choices)])  # [C]
        at += len(state.choices)
        out.append(float(p[state.bad].sum() / p.sum()))
    return statistics.mean(out)


def main(args: argparse.Namespace) -> None:
    cfg = load(args.config, args.set)
    Progress(0).activate()
    suite = build.suite(cfg)
    policy = build.policy(cfg, suite, workers=1)  # scored in this process, whatever policy.workers says
    torch.set_num_threads(args.threads)
    tasks = [t for split in ("heldout_seen", "heldout_unseen") for t in task_range(suite.tasks(split), args.range, cfg.eval.sizes(), args.tasks)]
    models = {"warm start": policy.model}
    for path in args.weights:
        model = copy.deepcopy(policy.model)
        model.load_state_dict(torch.load(path, map_location="cpu"))
        models[path] = model
    how = "sampled" if args.sample else "greedy"
    probes: tuple[list[Decision], list[Decision]] | None = None
    print(f"\n| weights | won ({how}) | lost: kinds | distinct receptacles per loss | P(take wrong) | P(go back) |")
    print("|---|---|---|---|---|---|")
    for name, model in models.items():
        episodes = rollout_lockstep(model, policy.prompt, suite, tasks, policy.sampling, greedy=not args.sample, seed=cfg.run.seed)
        if probes is None:  # the warm start's greedy states are the probe for every model
            greedy = episodes if not args.sample else rollout_lockstep(model, policy.prompt, suite, tasks, policy.sampling)
            take_wrong, go_back = decisions(suite, policy.prompt, greedy)
            probes = take_wrong[: args.probe_states], go_back[: args.probe_states]
        won, kinds, distinct = classify(suite, episodes)
        lost = "; ".join(f"{k} {v}" for k, v in kinds.most_common())
        mean_distinct = statistics.mean(distinct) if distinct else float("nan")
        print(f"| {name} | {won} / {len(episodes)} | {lost} | {mean_distinct:.1f} | "
              f"{bad_mass(model, probes[0]):.3f} | {bad_mass(model, probes[1]):.3f} |", flush=True)
    print(f"\nprobe states: {len(probes[0])} take-wrong, {len(probes[1])} go-back")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/learn.toml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--tasks", type=int, default=100, help="tasks per held-out split")
    parser.add_argument("--range", default="dev", choices=RANGES, help="the held-out task range (default: dev)")
    parser.add_argument("--sample", action="store_true", help="classify sampled episodes instead of greedy ones")
    parser.add_argument("--probe-states", type=int, default=200, help="states per probe (the first ones)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("weights", nargs="*", help="policy.pt files to compare with the warm start")
    main(parser.parse_args())
