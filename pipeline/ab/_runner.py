"""Plan and run a study: every arm x seed as its own `run.py` process, interleaved by seed, resumable.

    <out>/<name>/ab/
        plan.json            arms (with their overrides), seeds, baseline, budget, stop rule
        configs/<arm>-s<seed>.toml   the resolved config each run was started with
        logs/<arm>-s<seed>.log       its stdout and stderr
        <arm>-s<seed>/       its run folder (summary.json, metrics.jsonl, ...)
        report.md, report.json, *.png

A run is a child process (`run.py --config configs/<arm>-s<seed>.toml`): memory, threads and torch state
never leak from one arm into the next, and a run folder with a `summary.json` that does not say it was
interrupted (`finished_summary`) is a finished run, which is all resuming needs. Seeds are the outer loop, so
slow drift of a shared machine hits every arm alike, and the arms' order rotates from seed to seed (a cyclic
Latin square, recorded in plan.json as `order`) so no arm always runs first or last.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, RunConfig, dump_toml
from pipeline.heldout_curve import unmeasured

from ._control import rotated_order, screen_seeds
from ._presets import Preset, toml_value

Loader = Callable[[str | Path | None, Sequence[str]], RunConfig]
"""`pipeline.run.checks.load`: validates a config, names included (injected so this module stays a mechanism)."""

HARNESS_KEYS = ("run.seed", "run.name", "run.out", "run.progress", "profile.plot")


@dataclass(frozen=True)
class PlannedRun:
    arm: str
    seed: int
    config_toml: str
    """The resolved config, as written to configs/<name>.toml."""

    @property
    def name(self) -> str:
        return f"{self.arm}-s{self.seed}"


@dataclass
class Study:
    ab_dir: Path
    arms: list[Preset]
    seeds: list[int]
    baseline: str
    runs: list[PlannedRun] = field(default_factory=list)


def interleave(arms: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """Seed-major order, the arms rotated per seed (`_control.rotated_order`: a cyclic Latin square): seed 0 runs
    a, b, c; seed 1 runs b, c, a; ..."""
    order = rotated_order(arms, seeds)
    return [(arm, seed) for seed in seeds for arm in order[seed]]


def run_overrides(budget: Preset | None, arm: Preset, user: Sequence[str], seed: int, ab_dir: Path) -> list[str]:
    """Merge order: budget < arm < the user's --set < what the harness owns (seed, folder, no live line, no
    profile.png: the study draws every run's at its end, in one process)."""
    owned = [f"run.seed={seed}", f"run.name={toml_value(f'{arm.name}-s{seed}')}", f"run.out={toml_value(str(ab_dir))}",
             "run.progress=false", "profile.plot=false"]
    return [*(budget.overrides if budget else ()), *arm.overrides, *user, *owned]


def plan_study(
    load: Loader, base: str | None, budget: Preset | None, arms: Sequence[Preset], seeds: Sequence[int],
    user: Sequence[str], ab_dir: Path, baseline: str,
) -> Study:
    """Resolve and validate every arm x seed up front: one ConfigError lists every arm's problems."""
    problems = [f"--set {item}: the harness sets this itself" for item in user if item.split("=")[0].strip() in HARNESS_KEYS]
    problems += [] if baseline in {a.name for a in arms} else [f"baseline {baseline!r} is not one of the arms"]
    study = Study(ab_dir, list(arms), list(seeds), baseline)
    by_name = {a.name: a for a in arms}
    for arm_name, seed in interleave([a.name for a in arms], seeds):
        try:
            cfg = load(base, run_overrides(budget, by_name[arm_name], user, seed, ab_dir))
        except ConfigError as exc:
            if seed == seeds[0]:  # the same problem would repeat for every seed
                problems += [f"arm {arm_name}: {p}" for p in exc.problems]
            continue
        study.runs.append(PlannedRun(arm_name, seed, dump_toml(cfg)))
    if problems:
        raise ConfigError(problems)
    return study


def _comparable(config_toml: str) -> dict[str, Any]:
    data = tomllib.loads(config_toml)
    data.get("run", {}).pop("out", None)  # the study folder may have moved
    data.get("eval", {}).pop("curve_off_clock", None)  # where the curve is measured, in the run or after it: not the run
    data.get("profile", {}).pop("plot", None)  # when profile.png is drawn: not the run
    return data


def finished_summary(folder: Path) -> dict[str, Any] | None:
    """The summary of a run that ran to its end; None when the folder has no summary.json, or one of a run that
    was stopped (`stop_reason` "interrupted": Ctrl-C or SIGTERM, e.g. a study paused as the run began)."""
    path = folder / "summary.json"
    if not path.is_file():
        return None
    summary: dict[str, Any] = json.loads(path.read_text())
    return None if summary.get("stop_reason") == "interrupted" else summary


def finished(ab_dir: Path, run: PlannedRun) -> bool:
    """True when the run folder holds the summary of a finished run (`finished_summary`) written from this very
    config.

    Raises:
        ConfigError: the folder was finished with another config (changed arm, budget or --set).
    """
    folder = ab_dir / run.name
    if finished_summary(folder) is None:
        return False
    written = folder / "config.toml"
    if not written.is_file() or _comparable(written.read_text()) != _comparable(run.config_toml):
        raise ConfigError([f"{folder} was run with another config than this study now resolves "
                           f"(changed arm, budget or --set?): use another --name, or remove that folder"])
    return True


def check_resumable(study: Study) -> list[PlannedRun]:
    """The planned runs still to do; every finished run with a different config is one problem."""
    todo, problems = [], []
    for run in study.runs:
        try:
            if not finished(study.ab_dir, run):
                todo.append(run)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return todo


def set_aside(folder: Path, why: str = "unfinished") -> Path | None:
    """A run folder that does not count is kept for its events but out of the way, as `<name>.<why>-<n>`: an
    unfinished one (crash, Ctrl-C), or a finished one the machine's load flagged and `--redo-loaded` runs again."""
    if not folder.exists():
        return None
    n = 1
    while folder.with_name(f"{folder.name}.{why}-{n}").exists():
        n += 1
    return folder.rename(folder.with_name(f"{folder.name}.{why}-{n}"))


def set_aside_count(folder: Path, why: str) -> int:
    return sum(1 for _ in folder.parent.glob(f"{folder.name}.{why}-*"))


def to_redo(folder: Path, redo_loaded: int) -> bool:
    """A finished run the machine's load flagged (`machine_loaded`: other processes took CPU from it) that has
    been run fewer than `redo_loaded` times again: its wall clock, and under a wall budget what it learned,
    are not the arm's. The rule reads the load alone, never a result."""
    summary = finished_summary(folder)
    if redo_loaded <= 0 or summary is None:
        return False
    return summary.get("machine_loaded") is True and set_aside_count(folder, "loaded") < redo_loaded


@dataclass(frozen=True)
class RunOutcome:
    run: PlannedRun
    returncode: int
    seconds: float


def execute(run: PlannedRun, ab_dir: Path, command: Sequence[str]) -> RunOutcome:
    """Run one arm x seed as a child process; Ctrl-C lets the child stop cleanly, then re-raises."""
    (ab_dir / "configs").mkdir(parents=True, exist_ok=True)
    (ab_dir / "logs").mkdir(exist_ok=True)
    config_path = ab_dir / "configs" / f"{run.name}.toml"
    config_path.write_text(run.config_toml)
    set_aside(ab_dir / run.name)
    started = time.perf_counter()
    with (ab_dir / "logs" / f"{run.name}.log").open("w") as log_file:
        proc = subprocess.Popen([*command, "--config", str(config_path)], stdout=log_file, stderr=subprocess.STDOUT)
        try:
            returncode = proc.wait()
        except KeyboardInterrupt:
            _stop_child(proc)
            raise
    return RunOutcome(run, returncode, time.perf_counter() - started)


def _stop_child(proc: subprocess.Popen[bytes]) -> None:
    """A terminal's Ctrl-C reached the child too; a signal sent to the harness alone did not."""
    for action, grace_s in ((None, 2.0), (signal.SIGINT, 15.0)):
        if action is not None:
            proc.send_signal(action)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    proc.wait()


def write_plan(study: Study, meta: dict[str, Any]) -> None:
    study.ab_dir.mkdir(parents=True, exist_ok=True)
    plan = {
        "arms": [{"name": a.name, "file": str(a.path), "overrides": list(a.overrides), "description": a.description} for a in study.arms],
        "seeds": study.seeds,
        "baseline": study.baseline,
        "order": {str(s): o for s, o in rotated_order([a.name for a in study.arms], study.seeds).items()},
        **meta,
    }
    (study.ab_dir / "plan.json").write_text(json.dumps(plan, indent=2) + "\n")


def read_plan(ab_dir: Path) -> dict[str, Any]:
    path = ab_dir / "plan.json"
    if not path.is_file():
        raise ConfigError([f"{ab_dir}: no plan.json (not a study folder made by `run.py ab`)"])
    return json.loads(path.read_text())


def measure_warm_start(load: Loader, base: str | None, overrides: Sequence[str], seed: int, ab_dir: Path,
                       command: Sequence[str]) -> float | None:
    """The seed's warm start's held-out success on `dev` (mean over the splits), measured by `run.py pretrain` in a
    child process before any arm runs (the warm start is cached for the runs); None when it could not be measured."""
    sets = [*overrides, f"run.seed={seed}", 'eval.range="dev"', "run.progress=false"]
    try:
        cfg = load(base, sets)
    except ConfigError:  # e.g. a study measuring more tasks per split than dev holds (400 on final): all of dev
        cfg = load(base, [*sets, f"eval.tasks={load(base, [*sets, 'eval.tasks=0']).eval.ranges.dev}"])
    folder = ab_dir / "screening"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"s{seed}.toml"
    path.write_text(dump_toml(cfg))
    done = subprocess.run([*command, "pretrain", "--config", str(path)], capture_output=True, text=True)
    (folder / f"s{seed}.log").write_text(done.stdout + done.stderr)
    return warm_start_success(done.stdout) if done.returncode == 0 else None


def warm_start_success(stdout: str) -> float | None:
    """Mean success over the splits `run.py pretrain` printed ("<split>: success 31.5% over 200 tasks ...")."""
    values = []
    for line in stdout.splitlines():
        head, sep, rest = line.partition(": success ")
        if sep and head.strip() and "%" in rest:
            try:
                values.append(float(rest.split("%")[0]) / 100)
            except ValueError:
                continue
    return sum(values) / len(values) if values else None


def measure_curve(run: PlannedRun, ab_dir: Path, command: Sequence[str]) -> bool:
    """After the run has ended: its held-out curve is complete when heldout_curve.jsonl has a row for every version
    it kept (the run measured them itself, `eval.curve_off_clock`); else (it stopped first) `run.py curve <folder>`
    measures the rest in a child process no timed run overlaps (the next run starts after it). True when the curve
    is complete."""
    folder = ab_dir / run.name
    if not unmeasured(folder):
        return True
    with (ab_dir / "logs" / f"{run.name}.curve.log").open("w") as log_file:
        done = subprocess.run([*command, "curve", str(folder)], stdout=log_file, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        print(f"    its held-out curve failed (exit code {done.returncode}; logs/{run.name}.curve.log)", flush=True)
    return done.returncode == 0 and not unmeasured(folder)


def screened_seeds(load: Loader, base: str | None, overrides: Sequence[str], seeds: Sequence[int], screen: tuple[float, float],
                   ab_dir: Path, command: Sequence[str]) -> tuple[list[int], dict[int, str]]:
    """The study's seeds after the screening rule (`_control.screen_seeds`: `seeds` first, then the next ones up
    to 4x as many), each measured once (`measure_warm_start`): a resumed study reads the measures kept in
    `ab_dir/screening.json`. `run.py ab --screen` and a kind-"seeds" verdict's `screen` (bench/learn_seeds.py) use it;
    too few passing is a ConfigError."""
    cache_path = ab_dir / "screening.json"
    cache = {int(k): v for k, v in json.loads(cache_path.read_text()).items()} if cache_path.is_file() else {}

    def measure(seed: int) -> float | None:
        if seed not in cache:
            print(f"screening seed {seed}: its warm start on dev", flush=True)
            cache[seed] = measure_warm_start(load, base, overrides, seed, ab_dir, command)
            cache_path.write_text(json.dumps({str(k): v for k, v in cache.items()}, indent=2) + "\n")
        return cache[seed]

    candidates = [*seeds, *range(max(seeds) + 1, max(seeds) + 1 + 4 * len(seeds))]
    ab_dir.mkdir(parents=True, exist_ok=True)
    kept, out = screen_seeds(candidates, len(seeds), measure, *screen)
    if len(kept) < len(seeds):
        raise ConfigError([f"screening: only {len(kept)} of {len(candidates)} seeds tried passed ({', '.join(map(str, kept))}); "
                           "widen the rule or give other seeds"])
    return kept, out
