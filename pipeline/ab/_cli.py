"""`run.py ab`: run a study, rebuild its report, list the presets.

    python run.py ab [--arms A,B,...] [--seeds 0,1,2] [--budget default] [--config BASE] [--set K=V ...]
                     [--name NAME] [--out DIR] [--baseline ARM] [--aa-arm ARM] [--target-heldout X [--eval-every N] [--to-budget]]
                     [--keep-loaded-wall] [--redo-loaded N] [--dry-run]
    python run.py ab report RUN_DIR [--baseline ARM] [--keep-loaded-wall]
    python run.py ab list

Exit codes: 0 every run finished, 1 some run failed (the report covers the rest), 2 bad usage or
configuration (nothing was run), 130 interrupted (finished runs are kept; run the same command to resume).

Every study runs an A/A control arm: the baseline again as `<baseline>-aa` (the same config under another
name), or the arm `--aa-arm` names (e.g. a gate in shadow mode). Its ratio to the baseline is the study's noise
floor; the report marks a difference that does not exceed it "not resolved" (pipeline/ab/_control.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, RunSection

from ._control import aa_name
from ._markdown import report_markdown
from ._plots import write_plots, write_run_profiles
from ._presets import Preset, find_presets, list_presets
from ._report import build_report, read_run
from ._runner import (
    Loader,
    Study,
    check_resumable,
    execute,
    measure_curve,
    plan_study,
    read_plan,
    run_overrides,
    screened_seeds,
    set_aside,
    to_redo,
    write_plan,
)

DEFAULT_ARMS = "sync-grpo,async-grpo,gate,gate-stall,gate-shadow,greso,pilot-commit,composed"


def _study_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.py ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default=DEFAULT_ARMS, help=f"comma-separated arm names (configs/arms/*.toml) or .toml paths (default: {DEFAULT_ARMS})")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: 0,1,2)")
    p.add_argument("--budget", default="default", help="configs/budgets/<name>.toml, a .toml path, or `none` (default: default)")
    p.add_argument("--config", help="base TOML config (default: the base values, configs/base.toml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE", help="applied to every arm, after it")
    p.add_argument("--name", help="study folder <out>/<name>/ab (default: ab-<budget>)")
    p.add_argument("--out", help="parent of the study folder (default: the base config's run.out)")
    p.add_argument("--baseline", help="arm the others are compared to (default: the first arm)")
    p.add_argument("--aa-arm", help="one of --arms that changes nothing (e.g. a gate in shadow mode): the study's A/A control "
                                    "(default: the baseline run again as <baseline>-aa)")
    p.add_argument("--aa-of", help="with --aa-arm: the arm it is a no-op copy of, its floor's reference (default: the baseline)")
    p.add_argument("--target-heldout", type=float, help="stop each run at this held-out success and compare time to reach it")
    p.add_argument("--eval-every", type=int, help="held-out evaluation every N updates (with --target-heldout; default 2)")
    p.add_argument("--to-budget", action="store_true",
                   help="with --target-heldout: run every run on to its budget, keep its published weights every --eval-every "
                        "updates and measure its held-out curve off its clock, in the run's process once its figures are "
                        "written (eval.curve_off_clock; `run.py curve` only for a run that stopped first); the time to the "
                        "target is read off that curve")
    p.add_argument("--keep-loaded-wall", action="store_true", help=_KEEP_LOADED)
    p.add_argument("--redo-loaded", type=int, default=0, metavar="N",
                   help="run a run the machine's load flagged (summary machine_loaded) again, at most N times; the loaded "
                        "folders are kept as <arm>-s<seed>.loaded-<n> and named in the report (default: 0, kept as they are)")
    p.add_argument("--screen", metavar="LOW:HIGH",
                   help="before any arm runs, measure each seed's warm start on dev (run.py pretrain) and keep a seed only if "
                        "its success is within [LOW, HIGH] (e.g. 0.1:0.7); a seed left out draws the next seed number")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan, run nothing")
    return p


_KEEP_LOADED = ("keep the wall clock of runs on a loaded machine (summary machine_loaded) in wall means and ratios "
                "(default: left out; their env steps and tokens stay in)")


def main(argv: Sequence[str], *, load: Loader, command: Sequence[str], configs: Path) -> int:
    """`command` starts one run given `--config FILE` (run.py itself); `configs` holds arms/ and budgets/."""
    try:
        if argv[:1] == ["report"]:
            return _report_command(argv[1:])
        if argv[:1] == ["list"]:
            return _list_command(configs)
        return _study_command(_study_parser().parse_args(argv), load, command, configs)
    except ConfigError as exc:
        print(f"run.py ab: {exc}", file=sys.stderr)
        return 2


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError([f"--seeds {text!r}: expected comma-separated integers"]) from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError([f"--seeds {text!r}: give at least one seed, each once"])
    return seeds


def _stop_overrides(args: argparse.Namespace) -> list[str]:
    """The target rule as config: each run stops at `run.target_heldout`, measured every `eval.every` updates
    (the config check says what is wrong with either value)."""
    if args.target_heldout is None:
        problems = (["--eval-every is for --target-heldout (use --set eval.every=N otherwise)"] if args.eval_every is not None else []) \
            + (["--to-budget is for --target-heldout"] if args.to_budget else [])
        if problems:
            raise ConfigError(problems)
        return []
    every = 2 if args.eval_every is None else args.eval_every
    if args.to_budget:  # the target is read off each run's curve, measured by the run once its clock has stopped
        if not 0 <= args.target_heldout <= 1:
            raise ConfigError([f"--target-heldout {args.target_heldout}: run.target_heldout must be in [0, 1]"])
        if every < 1:
            raise ConfigError([f"--eval-every {every}: must be >= 1"])
        return ["eval.every=0", f"run.keep_weights_every={every}", "eval.curve_off_clock=true"]
    return [f"run.target_heldout={args.target_heldout}", f"eval.every={every}"]


def _study_command(args: argparse.Namespace, load: Loader, command: Sequence[str], configs: Path) -> int:
    arms = find_presets([a.strip() for a in args.arms.split(",") if a.strip()], configs / "arms", "arm")
    baseline = args.baseline or arms[0].name
    arms, aa_arm = with_aa_arm(arms, baseline, args.aa_arm)
    aa_of = args.aa_of or baseline
    if args.aa_of is not None and (args.aa_arm is None or aa_of not in {a.name for a in arms} or aa_of == aa_arm):
        raise ConfigError([f"--aa-of {aa_of!r}: give it with --aa-arm, naming another of the arms"])
    budget = None if args.budget == "none" else find_presets([args.budget], configs / "budgets", "budget")[0]
    seeds = _seeds(args.seeds)
    screen = _screen_bounds(args.screen)
    user = [*args.overrides, *_stop_overrides(args)]
    base_out = args.out or _run_out(load, args.config, [*(budget.overrides if budget else ()), *user])
    ab_dir = Path(base_out) / (args.name or f"ab-{args.budget if budget is None else budget.name}") / "ab"
    screened_out: dict[int, str] = {}
    if screen is not None and not args.dry_run:
        base_arm = next((a for a in arms if a.name == baseline), arms[0])
        seeds, screened_out = screened_seeds(load, args.config, [*run_overrides(budget, base_arm, user, 0, ab_dir)[:-4]],
                                              seeds, screen, ab_dir, command)
    study = plan_study(load, args.config, budget, arms, seeds, user, ab_dir, baseline)
    todo = check_resumable(study)
    if args.dry_run:
        _print_plan(study, budget, todo)
        return 0
    write_plan(study, {"aa_arm": aa_arm, "aa_of": aa_of, "screen": list(screen) if screen else None,
                       "screened_out": {str(s): why for s, why in screened_out.items()}, "budget": budget.name if budget else None, "base_config": args.config, "set": list(args.overrides),
                       "target_heldout": args.target_heldout, "to_budget": args.to_budget, "curve_off_clock": args.to_budget, "keep_loaded_wall": args.keep_loaded_wall,
                       "redo_loaded": args.redo_loaded, "argv": sys.argv})
    return _run_study(study, todo, command, args.redo_loaded, curve_off_clock=args.to_budget)


def with_aa_arm(arms: list[Preset], baseline: str, aa: str | None) -> tuple[list[Preset], str]:
    """The arms with the study's A/A control: `aa` when it names one of them, else the baseline again as
    `<baseline>-aa` (same overrides), placed right after the baseline."""
    names = [a.name for a in arms]
    if aa is not None:
        problems = [f"--aa-arm {aa!r} is not one of the arms ({', '.join(names)})"] if aa not in names else []
        problems += [f"--aa-arm {aa!r} is the baseline: the A/A arm is compared to it"] if aa == baseline else []
        if problems:
            raise ConfigError(problems)
        return arms, aa
    base = next((a for a in arms if a.name == baseline), None)
    if base is None:  # plan_study reports it with the other problems
        return arms, aa_name(baseline)
    if aa_name(baseline) in names:
        return arms, aa_name(baseline)
    clone = Preset(aa_name(baseline), base.path, base.overrides,
                   f"A/A control: {baseline} run again under another name, the study's noise floor")
    at = names.index(baseline) + 1
    return [*arms[:at], clone, *arms[at:]], clone.name


def _screen_bounds(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        low, high = (float(v) for v in text.split(":"))
    except ValueError:
        raise ConfigError([f"--screen {text!r}: expected LOW:HIGH, e.g. 0.1:0.7"]) from None
    if not 0 <= low <= high <= 1:
        raise ConfigError([f"--screen {text!r}: need 0 <= LOW <= HIGH <= 1"])
    return low, high


def _run_out(load: Loader, base: str | None, overrides: list[str]) -> str:
    """The base config's run.out; a problem there is left for the per-arm validation to report in full."""
    try:
        return load(base, overrides).run.out
    except ConfigError:
        return RunSection().out


def _print_plan(study: Study, budget: Preset | None, todo: list[Any]) -> None:
    print(f"study folder: {study.ab_dir}\nbudget: {budget.name if budget else 'none'} {list(budget.overrides) if budget else ''}")
    for arm in study.arms:
        print(f"arm {arm.name}: {' '.join(arm.overrides)}")
    for i, run in enumerate(study.runs, 1):
        print(f"[{i}/{len(study.runs)}] {run.name}: {'to run' if run in todo else 'finished'}")


def time_left(took: Sequence[float], left: int) -> str:
    """The study's remaining time at the pace of the runs this invocation ran (`took`, seconds each)."""
    if not left:
        return "no run left"
    minutes = round(left * sum(took) / len(took) / 60)
    return f"{left} run(s) left, about {minutes // 60} h {minutes % 60:02d} min at this pace (a redone or loaded run adds one)"


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM stops the study as Ctrl-C does: the run under way is stopped too (it would otherwise go on as an
    orphan, and a study started in the background, where SIGINT is ignored, had no clean way to stop)."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_study(study: Study, todo: list[Any], command: Sequence[str], redo_loaded: int = 0, *, curve_off_clock: bool = False) -> int:
    with _sigterm_as_ctrl_c():
        return _run_study_runs(study, todo, command, redo_loaded, curve_off_clock=curve_off_clock)


def _run_study_runs(study: Study, todo: list[Any], command: Sequence[str], redo_loaded: int, *, curve_off_clock: bool) -> int:
    failed, took = [], []
    print(f"A/B study: {len(study.arms)} arms x {len(study.seeds)} seeds, {len(todo)} to run, folder {study.ab_dir}", flush=True)
    try:
        for i, run in enumerate(study.runs, 1):
            folder = study.ab_dir / run.name
            if run not in todo and not to_redo(folder, redo_loaded):
                print(f"[{i}/{len(study.runs)}] {run.name}: finished earlier, kept", flush=True)
                if curve_off_clock and not measure_curve(run, study.ab_dir, command):
                    failed.append(f"{run.name} (its curve)")
                continue
            while True:
                if to_redo(folder, redo_loaded):
                    aside = set_aside(folder, "loaded")
                    print(f"[{i}/{len(study.runs)}] {run.name}: the machine's load flagged it ({aside.name if aside else ''}): "
                          "running it again", flush=True)
                print(f"[{i}/{len(study.runs)}] {run.name}: running (log: {study.ab_dir / 'logs' / (run.name + '.log')})", flush=True)
                outcome = execute(run, study.ab_dir, command)
                if outcome.returncode != 0:
                    failed.append(run.name)
                    print(f"    failed with exit code {outcome.returncode} after {outcome.seconds:.0f} s", flush=True)
                    break
                summary = json.loads((folder / "summary.json").read_text())
                print(f"    done in {outcome.seconds:.0f} s: GRPO {summary.get('grpo_wall_s', float('nan')):.1f} s, "
                      f"stop {summary.get('stop_reason')}, held-out {summary.get('heldout_success_before')} -> "
                      f"{summary.get('heldout_success_after')}" + (" (machine loaded)" if summary.get("machine_loaded") else ""),
                      flush=True)
                took.append(outcome.seconds)
                print("    " + time_left(took, sum(1 for later in study.runs[i:] if later in todo)), flush=True)
                if not to_redo(folder, redo_loaded):
                    break
            if curve_off_clock and run.name not in failed and not measure_curve(run, study.ab_dir, command):
                failed.append(f"{run.name} (its curve)")
            write_report(study.ab_dir, plots=False)  # the figures so far; the plots (most of a report's cost) at the end
        write_report(study.ab_dir)
    except KeyboardInterrupt:
        write_report(study.ab_dir)
        print(f"\nrun.py ab: interrupted; finished runs are kept, the same command resumes ({study.ab_dir})", file=sys.stderr)
        return 130
    print(f"\nreport: {study.ab_dir / 'report.md'}\n")
    print((study.ab_dir / "report.md").read_text())
    if failed:
        print(f"run.py ab: {len(failed)} run(s) failed: {', '.join(failed)} (see logs/)", file=sys.stderr)
        return 1
    return 0


def write_report(ab_dir: Path, baseline: str | None = None, keep_loaded_wall: bool | None = None, *,
                 plots: bool = True) -> dict[str, Any]:
    """Rebuild report.json, report.md and the plots from the study's finished runs (`keep_loaded_wall` None: the
    study's own choice; `plots` False: the report alone, as the harness writes it after each run)."""
    plan = read_plan(ab_dir)
    keep = bool(plan.get("keep_loaded_wall", False)) if keep_loaded_wall is None else keep_loaded_wall
    arms, seeds = [a["name"] for a in plan["arms"]], plan["seeds"]
    baseline = baseline or plan["baseline"]
    if baseline not in arms:
        raise ConfigError([f"baseline {baseline!r} is not one of the study's arms ({', '.join(arms)})"])
    records = [r for a in arms for s in seeds if (r := read_run(a, s, ab_dir / f"{a}-s{s}")) is not None]
    screened = {int(s): str(why) for s, why in plan.get("screened_out", {}).items()}
    order = {int(s): o for s, o in plan.get("order", {}).items()}
    report = build_report(records, arms=arms, seeds=seeds, baseline=baseline, target=plan.get("target_heldout"),
                          stops_at_target=not plan.get("to_budget", False), keep_loaded_wall=keep,
                          aa_arm=plan.get("aa_arm"), aa_of=plan.get("aa_of"), screened_out=screened, order=order)
    report["loaded_runs_set_aside"] = sorted(p.name for p in ab_dir.glob("*.loaded-*") if p.is_dir())
    if report["loaded_runs_set_aside"]:
        report["notes"].append("runs the machine's load flagged, set aside and run again (kept, not counted): "
                               + ", ".join(report["loaded_runs_set_aside"]))
    counted = {int(s) for b in report["arms"].values() for s in b["seeds"]}
    if plots:
        report["plots"] = write_plots(ab_dir, {a: {r.seed: r.curve for r in records if r.arm == a and r.seed in counted} for a in arms}, report)
        drawn = write_run_profiles([ab_dir / f"{r.arm}-s{r.seed}" for r in records])
        if drawn:
            report["notes"].append(f"profile.png drawn from profile.json for {drawn} run(s) (a study's runs skip it: profile.plot = false)")
        if not report["plots"]:
            report["notes"].append("no plots: matplotlib is not installed (pip install rollcut[plot])")
    else:
        report["plots"] = []
        report["notes"].append("plots: drawn when the study ends (`run.py ab report` draws them now)")
    report["study"] = {k: plan.get(k) for k in ("budget", "base_config", "set", "seeds", "screening")} | {
        "arms": {a["name"]: a["overrides"] for a in plan["arms"]}}
    (ab_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (ab_dir / "report.md").write_text(report_markdown(report, ab_dir.parent.name))
    return report


def _report_command(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="run.py ab report", description="rebuild report.md, report.json and the plots")
    p.add_argument("run_dir", help="the study folder: <out>/<name> or <out>/<name>/ab")
    p.add_argument("--baseline", help="compare to this arm instead of the study's baseline")
    p.add_argument("--keep-loaded-wall", action="store_true", default=None, help=_KEEP_LOADED)
    args = p.parse_args(argv)
    ab_dir = Path(args.run_dir)
    if not (ab_dir / "plan.json").is_file() and (ab_dir / "ab" / "plan.json").is_file():
        ab_dir = ab_dir / "ab"
    write_report(ab_dir, args.baseline, args.keep_loaded_wall)
    print((ab_dir / "report.md").read_text())
    return 0


def _list_command(configs: Path) -> int:
    for kind in ("arms", "budgets"):
        print(f"{kind} ({configs / kind}):")
        for preset in list_presets(configs / kind):
            print(f"  {preset.name:14s} {preset.description}")
    return 0

