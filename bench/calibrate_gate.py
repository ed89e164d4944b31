"""Calibrate the prefix gate's tau for a policy: precision / recall of each tau at checkpoint K.

    python bench/calibrate_gate.py [--groups 48] [--k 10] [--set section.key=value ...]

Samples G rollouts of `--groups` train tasks with the configured policy (its cached warm start) at the
configured temperature, computes d_K of each group and its true outcome (zero reward variance or not),
and prints the d_K distributions and, per tau, how many groups would be cut and the precision / recall
of those cuts against zero variance. The reference's tau = 0.12 was calibrated on a 7B model; a
different policy needs its own (shadow mode measures the same online: `--set gate.shadow=true`).
"""

from __future__ import annotations

import argparse

import trio

from gates import mean_prefix_edit_distance
from pipeline.job import build_policy, build_suite, load
from pipeline.rundir import configure_logging
from stages.policy.base import AgentContext


async def _episode(policy, suite, task, out: list) -> None:
    env = suite.make()
    try:
        obs = env.reset(task)
        history: list[tuple[str, str]] = []
        won = False
        for _ in range(suite.max_steps):
            action = (await policy.act(AgentContext(task.description, obs.text, obs.admissible, tuple(history)))).action
            result = env.step(action)
            history.append((obs.text, action))
            obs = result.observation
            if result.done:
                won = result.won
                break
    finally:
        env.close()
    out.append(([a for _, a in history], won))


async def sample_groups(policy, suite, tasks, group_size: int) -> list[list[tuple[list[str], bool]]]:
    groups = []
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        for task in tasks:
            out: list = []
            async with trio.open_nursery() as group:
                for _ in range(group_size):
                    group.start_soon(_episode, policy, suite, task, out)
            groups.append(out)
        nursery.cancel_scope.cancel()
    return groups


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=48)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    configure_logging(None)
    cfg = load(None, args.overrides)
    suite = build_suite(cfg)
    policy = build_policy(cfg, suite)
    tasks = list(suite.tasks("train"))[: args.groups]
    groups = trio.run(sample_groups, policy, suite, tasks, cfg.rollout.group_size)
    rows = []
    for group in groups:
        actions = [a for a, _ in group]
        if all(len(a) < args.k for a in actions):
            continue  # every member ended before K: the gate never evaluates
        rows.append((mean_prefix_edit_distance(actions, args.k), len({won for _, won in group}) == 1))
    zero = sorted(d for d, z in rows if z)
    mixed = sorted(d for d, z in rows if not z)
    print(f"{len(rows)} groups evaluated at K={args.k} (temperature {cfg.policy.temperature}): "
          f"{len(zero)} zero-variance, {len(mixed)} mixed")
    print("d_K of zero-variance groups:", " ".join(f"{d:.2f}" for d in zero))
    print("d_K of mixed groups:        ", " ".join(f"{d:.2f}" for d in mixed))
    print("| tau | cut | TP | FP | precision | recall |\n|---|---|---|---|---|---|")
    for tau in (0.12, 0.2, 0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7):
        cut = [z for d, z in rows if d < tau]
        tp = sum(cut)
        precision = f"{tp / len(cut):.2f}" if cut else "n/a"
        print(f"| {tau} | {len(cut)} | {tp} | {len(cut) - tp} | {precision} | {tp / max(1, len(zero)):.2f} |")


if __name__ == "__main__":
    main()
