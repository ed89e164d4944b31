"""Does RL lift held-out success? A preset run on several seeds, tabulated with the range over seeds or an interval.

    .venv/bin/python bench/learn_seeds.py [--config configs/learn.toml] [--seeds 0 1 2] [--set key=value ...]
    .venv/bin/python bench/learn_seeds.py --config default        # the default run (no config file)
    .venv/bin/python bench/learn_seeds.py --report runs/learn-s0 runs/learn-s1 runs/learn-s2

Runs `run.py` once per seed, one after the other (each run has the machine to itself: its wall time is
the figure), into run folders `<run.name>-s<seed>`, then prints one markdown row per seed (held-out
seen / unseen / mean before -> after, job wall seconds, GRPO wall seconds, env steps, learner updates)
and the mean rise over seeds with the range over the seeds (below 5 seeds) or its 95 % paired percentile bootstrap
interval (5 seeds or more; seeds resampled, before and
after of a seed kept together: `pipeline.ab._stats.paired_difference`). `--report` tabulates existing
run folders instead. The warm start of a seed is trained on first use and cached; build it beforehand
(`run.py pretrain --set run.seed=N`) for a wall time that counts only the cached load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.ab._stats import paired_difference  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.rundir import free_run_name  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_seeds(config: Path | None, seeds: list[int], overrides: list[str]) -> list[Path]:
    """Run the preset (None: the built-in defaults) once per seed; returns the run folders in seed order."""
    run = load_config(config, overrides).run
    out = Path(run.out) if Path(run.out).is_absolute() else ROOT / run.out
    preset = ["--config", str(config)] if config is not None else []
    folders = []
    for seed in seeds:
        folder = free_run_name(out, f"{run.name}-s{seed}")  # the folder run.py will use, not an older run's
        sets = [*overrides, f"run.seed={seed}", f'run.name="{folder}"']
        command = [sys.executable, str(ROOT / "run.py"), *preset, *(a for s in sets for a in ("--set", s))]
        print(f"seed {seed}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        subprocess.run(command, cwd=ROOT, check=True)
        folders.append(out / folder)
    return folders


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def _curve(summary: dict) -> str:
    """The periodic held-out measures of a run (mean of the splits), e.g. "8: 47.0, 16: 47.2"."""
    points = [(p["iteration"], p.get("heldout/mean")) for p in summary.get("heldout_curve", [])]
    return ", ".join(f"{i}: {_pct(m)}" for i, m in points if m is not None) or "none"


def report(folders: list[Path]) -> str:
    """A markdown table of the runs' held-out success before -> after, their cost, and the mean rise."""
    rows = [json.loads((folder / "summary.json").read_text()) for folder in folders]
    lines = [
        "| seed | seen before → after | unseen before → after | mean before → after | rise (pp) | mean on the way (update: %) | job wall s | GRPO wall s | env steps | learner updates |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    before: dict[int, float | None] = {}
    after: dict[int, float | None] = {}
    for s in rows:
        seed = s["seed"]
        b, a = s["heldout_before"], s["heldout_after"]
        before[seed], after[seed] = s["heldout_success_before"], s["heldout_success_after"]
        rise = None if before[seed] is None or after[seed] is None else after[seed] - before[seed]
        lines.append(
            f"| {seed} | {_pct(b.get('heldout_seen'))} → {_pct(a.get('heldout_seen'))} "
            f"| {_pct(b.get('heldout_unseen'))} → {_pct(a.get('heldout_unseen'))} "
            f"| {_pct(before[seed])} → {_pct(after[seed])} | {_pct(rise)} | {_curve(s)} "
            f"| {s['wall_s']:.0f} | {s['grpo_wall_s']:.0f} | {s['env_steps']} | {s['learner_updates']} |"
        )
    interval = paired_difference(before, after)
    if interval is not None:
        lines.append("")
        lines.append(
            f"Mean rise over seeds {list(interval.seeds)}: {100 * interval.estimate:+.1f} pp "
            f"({interval.describe()}: [{100 * interval.ci_low:+.1f}, {100 * interval.ci_high:+.1f}]). "
            f"Held-out tasks per split: {rows[0]['heldout_tasks_per_split']}."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "learn.toml"), help="a TOML preset, or 'default'")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--report", type=Path, nargs="+", metavar="RUN_DIR", help="tabulate these run folders, run nothing")
    args = parser.parse_args()
    config = None if args.config == "default" else Path(args.config)
    folders = args.report or run_seeds(config, args.seeds, args.set)
    print(report(folders))


if __name__ == "__main__":
    main()
