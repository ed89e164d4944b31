"""What a warm start gives RL: held-out success and the group composition at the rollout temperature.

    .venv/bin/python bench/bench_warm_start.py [--tasks 200] [--groups 32] [--set key=value ...]

Builds the configured torch_tiny policy (behaviour cloning on first use, else the cached checkpoint:
the line says which and how long training took), then, in lockstep with one torch thread:

* greedy success on the first `--tasks` tasks of each held-out split (what `eval` measures);
* `--groups` train tasks (the last ones of the split, never demonstrations) sampled G = 8 times at the
  policy's temperature / top-p, counted as all-fail / mixed / all-succeed groups (GRPO learns from
  mixed groups only).

Prints one markdown row per run, ready for docs/policy.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec
import torch
from structlog.testing import capture_logs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.progress import Progress  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from stages.policy.torch_tiny._build import bc_report, decode_tiny_options  # noqa: E402


def main(args: argparse.Namespace) -> None:
    cfg = load(args.config, args.set)
    Progress(0).activate()  # warm-start and evaluation progress on stderr
    suite = build.suite(cfg)
    started = time.perf_counter()
    with capture_logs() as logs:
        policy = build.policy(cfg, suite, workers=1)  # scored in this process, whatever policy.workers says
    built_s = time.perf_counter() - started
    cached = any(e["event"] == "policy.bc.cache_hit" for e in logs)
    opts = msgspec.structs.replace(
        decode_tiny_options(cfg.policy.options, cfg.policy.max_new_tokens), bc_eval_tasks=args.tasks, bc_group_tasks=args.groups
    )
    torch.set_num_threads(1)
    report = bc_report(policy.model, policy.prompt, suite, policy.sampling, opts, seed=cfg.run.seed)
    p = cfg.pretrain
    how = "loaded from the cache" if cached else "trained"
    print(f"\nwarm start {how} in {built_s:.0f} s; evaluation {report['eval_s']:.0f} s")
    print("| demos | epochs | noise | DAgger rounds x tasks | seen | unseen | groups fail / mixed / succeed |")
    groups = (
        f"{report['groups_all_fail']} / {report['groups_mixed']} / {report['groups_all_succeed']}" if args.groups else "not measured"
    )
    seen, unseen = (f"{report[k]:.3f}" if k in report else "not measured" for k in ("success_heldout_seen", "success_heldout_unseen"))
    print(f"| {p.demos} | {p.epochs} | {p.noise} | {p.dagger_rounds} x {p.dagger_tasks} | {seen} | {unseen} | {groups} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--set", action="append", default=[], help="config override key=value (repeatable)")
    main(parser.parse_args())
