"""Does RL lift held-out success? A preset run on several seeds, tabulated with the range over seeds or an interval.

    .venv/bin/python bench/learn_seeds.py [--config configs/learn.toml] [--seeds 0 1 2] [--set key=value ...]
    .venv/bin/python bench/learn_seeds.py --config default        # the default run (no config file)
    .venv/bin/python bench/learn_seeds.py --report runs/learn-s0 runs/learn-s1 runs/learn-s2
    .venv/bin/python bench/learn_seeds.py --verdict configs/verdicts/learn-preset.toml   # a declared verdict

Runs `run.py` once per seed, one after the other (each run has the machine to itself: its wall time is
the figure), into run folders `<run.name>-s<seed>`, then prints one markdown row per seed (held-out
seen / unseen / mean before -> after on the run's task range, job wall seconds, GRPO wall seconds, the GRPO
phase's mean 1-minute load against the cores, env steps, learner updates) and the mean rise over seeds with
its 95 % Student-t interval on the per-seed rises (before and after of a seed kept together:
`pipeline.ab._stats.paired_difference`; one seed: no interval). Folders
that rerun a seed count as one seed (the mean of its runs) and their spread is printed. `--report`
tabulates existing run folders instead. The warm start of a seed is trained on first use and cached; build
it beforehand (`run.py pretrain --set run.seed=N`) for a wall time that counts only the cached load.

Without `--verdict` the runs measure `eval.range` (dev by default: tuning). `--verdict FILE` runs exactly a
declared verdict (`pipeline/verdict.py`, configs/verdicts/): its config, overrides and new seeds on the test
range, kind "seeds" here and kind "ab" through `run.py ab`, and writes `FILE.result.md` / `.result.json`
beside it whatever the figure is; a verdict with a result already, or not committed as it stands, is refused
(exit 2; `--uncommitted` runs one anyway and says so in the result). A verdict's `screen = [low, high]` is
applied before any seed runs (kind "seeds" here, kind "ab" by `run.py ab --screen`): each seed's warm start is
measured on dev by `run.py pretrain` and one outside the rule is replaced by the next seed up; the result names the
seeds left out. A verdict resumes: a seed whose run
finished is kept, one stopped by Ctrl-C runs again, and one the machine's load flagged runs again up to
`REDO_LOADED` times (the set-aside folders are kept and named in the result).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.ab._report import run_commit  # noqa: E402
from pipeline.ab._runner import screened_seeds  # noqa: E402
from pipeline.ab._stats import paired_difference  # noqa: E402
from pipeline.config import ConfigError, load_config  # noqa: E402
from pipeline.rundir import free_run_name  # noqa: E402
from pipeline.verdict import Verdict, declared_commit, head_commit, load_verdict, result_paths  # noqa: E402
from run import DEFAULT_RUN  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _command(config: Path, sets: list[str]) -> list[str]:
    return [sys.executable, str(ROOT / "run.py"), "--config", str(config), *(a for s in sets for a in ("--set", s))]


def _out(config: Path, overrides: list[str]) -> tuple[Path, str]:
    run = load_config(config, overrides).run
    return (Path(run.out) if Path(run.out).is_absolute() else ROOT / run.out), run.name


def run_seeds(config: Path, seeds: list[int], overrides: list[str]) -> list[Path]:
    """Run the preset once per seed; returns the run folders in seed order."""
    out, name = _out(config, overrides)
    folders = []
    for seed in seeds:
        folder = free_run_name(out, f"{name}-s{seed}")  # the folder run.py will use, not an older run's
        command = _command(config, [*overrides, f"run.seed={seed}", f'run.name="{folder}"'])
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


def _load(summary: dict) -> str:
    """The GRPO phase's mean 1-minute load / the cores it had, "loaded" when the run flagged a loaded machine."""
    load, cores = summary.get("load_1m_mean"), summary.get("cores_available")
    if load is None or cores is None:
        return "n/a"
    return f"{load:.1f} / {cores}" + (" loaded" if summary.get("machine_loaded") else "")


def report(folders: list[Path]) -> str:
    """A markdown table of the runs' held-out success before -> after, their cost, and the mean rise (a seed
    run more than once counts once, as the mean of its runs, and the spread of its reruns is printed)."""
    rows = [json.loads((folder / "summary.json").read_text()) for folder in folders]
    lines = [
        "| seed | seen before → after | unseen before → after | mean before → after | rise (pp) | mean on the way (update: %) "
        "| job wall s | GRPO wall s | load 1 min / cores | env steps | learner updates |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for s in rows:
        seed = s["seed"]
        b, a = s["heldout_before"], s["heldout_after"]
        before, after = s["heldout_success_before"], s["heldout_success_after"]
        rise = None if before is None or after is None else after - before
        if rise is not None:
            runs[seed].append((before, after))
        lines.append(
            f"| {seed} | {_pct(b.get('heldout_seen'))} → {_pct(a.get('heldout_seen'))} "
            f"| {_pct(b.get('heldout_unseen'))} → {_pct(a.get('heldout_unseen'))} "
            f"| {_pct(before)} → {_pct(after)} | {_pct(rise)} | {_curve(s)} "
            f"| {s['wall_s']:.0f} | {s['grpo_wall_s']:.0f} | {_load(s)} | {s['env_steps']} | {s['learner_updates']} |"
        )
    mean = {seed: (sum(b for b, _ in r) / len(r), sum(a for _, a in r) / len(r)) for seed, r in runs.items()}
    interval = paired_difference({s: m[0] for s, m in mean.items()}, {s: m[1] for s, m in mean.items()})
    if interval is not None:
        ranges = sorted({str(s.get("heldout_range", "dev (before task ranges)")) for s in rows})
        lines += ["", (
            f"Mean rise over seeds {list(interval.seeds)}: {100 * interval.estimate:+.1f} pp "
            f"({interval.describe()}" + (f": [{100 * interval.ci_low:+.1f}, {100 * interval.ci_high:+.1f}]" if interval.ci_low is not None
                                          else "") + "). "
            f"Held-out tasks per split: {rows[0]['heldout_tasks_per_split']}, range {', '.join(ranges)}."
        )]
    for seed, r in sorted(runs.items()):
        if len(r) > 1:
            rises = [100 * (a - b) for b, a in r]
            lines.append(f"Reruns of seed {seed}: {len(r)} runs, rise {' / '.join(f'{x:+.1f}' for x in rises)} pp "
                         f"(spread {max(rises) - min(rises):.1f} pp; the seed counts once, as their mean).")
    return "\n".join(lines)


# ---- declared verdicts --------------------------------------------------------------------------------------


def _finished(folder: Path) -> bool:
    """A run folder whose run ended on its own: a summary that no Ctrl-C / SIGTERM wrote (an interrupted run
    writes one too, with `stop_reason = "interrupted"` and no held-out measure after)."""
    path = folder / "summary.json"
    return path.is_file() and json.loads(path.read_text()).get("stop_reason") != "interrupted"


REDO_LOADED = 2
"""A verdict seed whose run the machine's load flagged (`machine_loaded`: other processes took CPU from it) runs
again, at most this many times: under a wall-clock budget (the learn preset's `run.max_wall_s`) another
process's CPU changes how many updates the run makes, so what it learns. The rule looks at the load alone,
never at the result; the loaded folders are kept (`.loaded-N`) and named in the result."""


def _loaded(folder: Path) -> bool:
    return json.loads((folder / "summary.json").read_text()).get("machine_loaded") is True


def _count(folder: Path, why: str) -> int:
    return sum(1 for _ in folder.parent.glob(f"{folder.name}.{why}-*"))


def _set_aside(folder: Path, why: str = "unfinished") -> Path:
    """A run folder of a verdict that does not count (crash or Ctrl-C: `unfinished`; `loaded`) is kept, out of
    the way of the rerun."""
    n = 1
    while folder.with_name(f"{folder.name}.{why}-{n}").exists():
        n += 1
    return folder.rename(folder.with_name(f"{folder.name}.{why}-{n}"))


def _config_path(name: str) -> Path:
    """A config file; "default" is the default run (what `python run.py` runs)."""
    return DEFAULT_RUN if name == "default" else ROOT / name


def _verdict_seeds(verdict: Verdict, name: str) -> tuple[dict[str, Any], str]:
    """Kind "seeds": each seed into `<out>/verdict-<name>-s<seed>` (a finished one is kept, a loaded one run
    again up to REDO_LOADED times); the result."""
    config = _config_path(verdict.config)
    overrides = verdict.overrides()
    out, _ = _out(config, overrides)
    seeds, screened_out = list(verdict.seeds), {}
    if verdict.screen:  # the declared rule, before any seed runs: a seed left out is replaced by the next one
        seeds, screened_out = screened_seeds(load_config, str(config), overrides, seeds, (verdict.screen[0], verdict.screen[1]),
                                             out / f"verdict-{name}-screening", [sys.executable, str(ROOT / "run.py")])
    folders, failed = [], {}
    for seed in seeds:
        folder = out / f"verdict-{name}-s{seed}"
        while True:
            if _finished(folder):
                if not _loaded(folder) or _count(folder, "loaded") >= REDO_LOADED:
                    print(f"seed {seed}: {folder} finished, kept", file=sys.stderr, flush=True)
                    folders.append(folder)
                    break
                aside = _set_aside(folder, "loaded")
                print(f"seed {seed}: the machine's load flagged its run ({aside.name}): running it again",
                      file=sys.stderr, flush=True)
            elif folder.exists():
                _set_aside(folder)
            command = _command(config, [*overrides, f"run.seed={seed}", f'run.name="{folder.name}"'])
            print(f"seed {seed}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
            returncode = subprocess.run(command, cwd=ROOT).returncode
            if returncode != 0 or not _finished(folder):
                failed[seed] = returncode
                break
    table = report(folders) if folders else "No seed finished."
    summaries = {s["seed"]: s for s in (json.loads((f / "summary.json").read_text()) for f in folders)}
    folder_of = {json.loads((f / "summary.json").read_text())["seed"]: f for f in folders}
    keep = ("heldout_range", "heldout_tasks_per_split", "heldout_before", "heldout_after", "heldout_success_before",
            "heldout_success_after", "heldout_curve", "wall_s", "grpo_wall_s", "warm_start_s", "env_steps", "generated_tokens",
            "learner_updates", "stop_reason", "load_1m_min", "load_1m_mean", "load_1m_max", "cores_available",
            "other_cpu_cores", "machine_loaded")
    loaded_before = {seed: sorted(str(f) for f in out.glob(f"verdict-{name}-s{seed}.loaded-*")) for seed in seeds}
    if any(loaded_before.values()):
        table += ("\n\nRuns the machine's load flagged, set aside and run again (kept, not counted): "
                  + ", ".join(Path(f).name for fs in loaded_before.values() for f in fs) + ".")
    if screened_out:
        table += ("\n\nSeeds the declared screening rule left out before anything ran: "
                  + "; ".join(f"{s}: {why}" for s, why in screened_out.items()) + ".")
    data = {"folders": [str(f) for f in folders], "failed_seeds": failed, "seeds_run": seeds,
            "screened_out": {str(s): why for s, why in screened_out.items()},
            "loaded_runs_set_aside": {str(seed): f for seed, f in loaded_before.items() if f},
            "per_seed": {str(seed): {k: s.get(k) for k in keep} for seed, s in sorted(summaries.items())}}
    rise = paired_difference({s: v["heldout_success_before"] for s, v in summaries.items()},
                             {s: v["heldout_success_after"] for s, v in summaries.items()})
    data["rise"] = rise.to_json() if rise is not None else None
    data["run_commits"] = {str(seed): run_commit(s, folder_of[seed]) for seed, s in sorted(summaries.items())}
    if failed:
        table += "\n\nFailed seeds (exit code): " + ", ".join(f"{s} ({c})" for s, c in failed.items()) + "."
    return data, table


def _verdict_ab(verdict: Verdict, name: str) -> tuple[dict[str, Any], str]:
    """Kind "ab": `run.py ab` with the verdict's arms, seeds, budget and target rule (it resumes a study it finished
    part of, and runs a run the machine's load flagged again, up to REDO_LOADED times)."""
    config = _config_path(verdict.config)
    out, _ = _out(config, verdict.overrides())
    command = [sys.executable, str(ROOT / "run.py"), "ab", "--arms", ",".join(verdict.arms),
               "--seeds", ",".join(map(str, verdict.seeds)), "--budget", verdict.budget, "--name", f"verdict-{name}",
               "--out", str(out), "--baseline", verdict.baseline or verdict.arms[0],
               "--redo-loaded", str(REDO_LOADED),
               *(["--target-heldout", str(verdict.target_heldout)] if verdict.target_heldout is not None else []),
               *(["--eval-every", str(verdict.eval_every)] if verdict.eval_every is not None else []),
               *(["--to-budget"] if verdict.to_budget else []),
               *(["--aa-arm", verdict.aa_arm] if verdict.aa_arm else []),
               *(["--aa-of", verdict.aa_of] if verdict.aa_of else []),
               *(["--screen", f"{verdict.screen[0]}:{verdict.screen[1]}"] if verdict.screen else []),
               "--config", str(config), *(a for s in verdict.overrides() for a in ("--set", s))]
    print(" ".join(command[1:]), file=sys.stderr, flush=True)
    returncode = subprocess.run(command, cwd=ROOT).returncode
    ab_dir = out / f"verdict-{name}" / "ab"
    if not (ab_dir / "report.json").is_file():
        return {"ab_dir": str(ab_dir), "exit_code": returncode}, f"`run.py ab` wrote no report (exit code {returncode})."
    table = (ab_dir / "report.md").read_text()
    if returncode != 0:
        table += f"\n`run.py ab` exited with {returncode}: some run failed (its logs are in {ab_dir / 'logs'}).\n"
    report = json.loads((ab_dir / "report.json").read_text())
    return {"ab_dir": str(ab_dir), "exit_code": returncode, "report": report, "run_commits": report.get("commits", {})}, table


def run_verdict(path: Path, *, allow_uncommitted: bool = False) -> int:
    """Run the declared verdict in `path` and write its result beside it; 2 when it may not run."""
    try:
        verdict = load_verdict(path)
    except ConfigError as exc:
        print(f"learn_seeds: {exc}", file=sys.stderr)
        return 2
    result_md, result_json = result_paths(path)
    declared = declared_commit(path)
    refusals = [f"{result_md} exists: a verdict runs once (its result is in)"] if result_md.exists() else []
    refusals += [f"{path} does not pin {what}: a verdict pins every setting it reads" for what in verdict.unpinned()]
    if declared is None and not allow_uncommitted:
        refusals.append(f"{path} is not committed as it stands: commit it before it runs (or --uncommitted)")
    if refusals:
        print("learn_seeds: " + "; ".join(refusals), file=sys.stderr)
        return 2
    started, at = time.perf_counter(), head_commit(ROOT)
    name = path.name.removesuffix(".toml")
    try:
        data, table = (_verdict_seeds if verdict.kind == "seeds" else _verdict_ab)(verdict, name)
    except ConfigError as exc:  # e.g. too few seeds passed the declared screening rule: nothing was run
        print(f"learn_seeds: {exc}", file=sys.stderr)
        return 2
    if verdict.kind == "ab" and (data.get("exit_code") == 130 or data.get("exit_code", 0) < 0):
        print(f"learn_seeds: `run.py ab` was stopped (exit code {data['exit_code']}): a stopped verdict has no result; "
              "run the same command to resume it (finished runs are kept)", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - started
    header = {"verdict": msgspec.to_builtins(verdict), "file": str(path), "declared_commit": declared or "not committed",
              "run_commit": at, "seconds": round(seconds, 1), "finished": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    result_json.write_text(json.dumps(header | data, indent=2) + "\n")
    result_md.write_text("\n".join([
        f"# Verdict `{name}`: result", "",
        f"Declared in commit {declared or '(not committed: run with --uncommitted)'} (`{path.name}`); runs at commit {at}; "
        f"finished {header['finished']} after {seconds / 3600:.2f} h.", "",
        f"* **Figure:** {verdict.figure}", f"* **Goal:** {verdict.goal}",
        *([f"* **Replaces (dev):** {verdict.replaces}"] if verdict.replaces else []),
        f"* **Range:** {verdict.range}; seeds {verdict.seeds}; config `{verdict.config}`, set {verdict.set}", "",
        table.rstrip(), "",
    ]))
    print(result_md.read_text())
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "learn.toml"), help="a TOML preset, or 'default'")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--report", type=Path, nargs="+", metavar="RUN_DIR", help="tabulate these run folders, run nothing")
    parser.add_argument("--verdict", type=Path, metavar="FILE", help="run this declared verdict (configs/verdicts/*.toml) exactly")
    parser.add_argument("--uncommitted", action="store_true", help="run a verdict file that is not committed as it stands")
    args = parser.parse_args()
    if args.verdict is not None:
        if args.report or args.set or args.seeds != [0, 1, 2] or args.config != parser.get_default("config"):
            print("learn_seeds: --verdict runs the file exactly: no --config, --seeds, --set or --report", file=sys.stderr)
            return 2
        return run_verdict(args.verdict, allow_uncommitted=args.uncommitted)
    config = DEFAULT_RUN if args.config == "default" else Path(args.config)
    folders = args.report or run_seeds(config, args.seeds, args.set)
    print(report(folders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
