"""Declared verdicts: a figure measured on a range no tuning read (final; test before), new seeds, declared first.

A verdict is a committed TOML file, `configs/verdicts/<name>.toml`:

    kind = "seeds"                      # one config on each seed (bench/learn_seeds.py), or "ab": arms x seeds (run.py ab)
    config = "configs/learn.toml"       # a preset, or "default" (the default run: configs/default.toml)
    set = ["eval.tasks=400"]            # overrides, as --set
    seeds = [100, 101, 102, 103, 104]   # new seeds, >= 100: no tuning ever ran on them
    range = "final"                     # the before / after measure's task range: final (declared from issue 56
                                        # on), or test (kept for comparison with the verdicts that read it)
    figure = "..."                      # what is measured and how it is summarised
    goal = "..."                        # what it must show, stated before it runs
    replaces = "..."                    # the dev figure it replaces (docs quote both)
    arms = ["async-grpo", "gate-stall"] # kind "ab" only, with budget and baseline
    budget = "default"
    baseline = "async-grpo"
    target_heldout = 0.45               # kind "ab": stop each run at this success on the valid range (time to target)
    eval_every = 6                      # kind "ab": the valid measure every N updates (with target_heldout)
    to_budget = true                    # kind "ab": the target read off the curve, every run on to its budget
    ranges = {dev = 200, valid = 200, test = 400}   # eval.ranges, pinned: a verdict pins every setting it reads
    aa_arm = "gate-stall-shadow"        # kind "ab": the A/A control arm (default: the baseline again, `run.py ab`)
    aa_of = "async-grpo"                # kind "ab": the arm it is a no-op copy of (default: the baseline)
    screen = [0.1, 0.7]                 # keep a seed only if its warm start wins within this on dev, drawing the
                                        # next seed until as many pass (both kinds), before anything runs

`python bench/learn_seeds.py --verdict configs/verdicts/<name>.toml` runs exactly that (nothing on its command
line may change it), and writes `<name>.result.md` and `<name>.result.json` beside it, whatever the figure
is. A verdict runs once: a file that already has a result, or that is not committed as it stands (so it
was not declared before it ran), is refused unless told otherwise, and the result names the commit the file
was declared in, the commit the runner ran at and the commit each run recorded in its folder. A verdict that
does not pin `ranges` (the task ranges every held-out figure it reads is cut by) is refused when it is run:
a later change of the defaults must not move the tasks it measures.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from .config import ConfigError
from .task_ranges import FINAL

VERDICT_RANGES = ("test", FINAL)
"""What a verdict's before / after measure may read: final for a verdict declared from issue 56 on; test is kept
for the verdicts that read it (five by then)."""

FIRST_VERDICT_SEED = 100
"""Seeds below this were used while tuning (0-2 above all); a verdict's seeds are new."""
HARNESS_KEYS = ("run.seed", "run.name", "run.progress", "eval.range", "eval.verdict")
"""What the verdict runner sets itself: a verdict's `set` may not (nor `run.out` in kind "ab": `run.py ab` sets it)."""


class Verdict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    kind: Literal["seeds", "ab"]
    seeds: list[int]
    figure: str
    goal: str
    range: str = "test"
    config: str = "default"
    set: list[str] = []
    replaces: str = ""
    arms: list[str] = []
    budget: str = ""
    baseline: str = ""
    target_heldout: float | None = None
    eval_every: int | None = None
    to_budget: bool = False
    name: str = ""
    """The file's stem (set by `load_verdict`): the runs get it as `eval.verdict`, which lets them read the final range."""
    ranges: dict[str, int] = {}
    """eval.ranges, pinned (tasks per split of each range); required of a verdict run from issue 56 on."""
    aa_arm: str = ""
    aa_of: str = ""
    screen: list[float] = []
    """[low, high]: the screening rule (`pipeline.ab._runner.screened_seeds`): kind "ab" as `run.py ab --screen
    low:high`, kind "seeds" in bench/learn_seeds.py, before any run."""

    def problems(self) -> list[str]:
        problems = []
        if self.range not in VERDICT_RANGES:
            problems.append(f"range = {self.range!r}: a verdict reads the {FINAL} range (or test, which earlier verdicts read; "
                            "dev and valid are for tuning and stop rules)")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            problems.append("seeds: give at least one seed, each once")
        if [s for s in self.seeds if s < FIRST_VERDICT_SEED]:
            problems.append(f"seeds {[s for s in self.seeds if s < FIRST_VERDICT_SEED]}: a verdict's seeds are new ones, >= {FIRST_VERDICT_SEED}")
        problems += [f"{key} is empty: state it before the verdict runs" for key in ("figure", "goal") if not getattr(self, key).strip()]
        owned = HARNESS_KEYS + (("run.out",) if self.kind == "ab" else ())
        problems += [f"set {item!r}: the verdict runner sets {item.split('=')[0].strip()} itself"
                     for item in self.set if item.split("=")[0].strip() in owned]
        problems += [f"set {item!r}: pin the task ranges with ranges = {{...}}" for item in self.set if item.startswith("eval.ranges")]
        if self.kind == "ab":
            if len(self.arms) < 2:
                problems.append("kind = 'ab' needs arms = [baseline, other, ...]")
            if not self.budget:
                problems.append("kind = 'ab' needs a budget (configs/budgets/<name>.toml, or 'none')")
            if self.baseline and self.baseline not in self.arms:
                problems.append(f"baseline {self.baseline!r} is not one of the arms")
            if self.target_heldout is not None and not 0 < self.target_heldout <= 1:
                problems.append(f"target_heldout = {self.target_heldout}: a held-out success in (0, 1]")
            if self.eval_every is not None and (self.eval_every < 1 or self.target_heldout is None):
                problems.append("eval_every: >= 1, and only with target_heldout")
            if self.to_budget and self.target_heldout is None:
                problems.append("to_budget: only with target_heldout")
            if self.aa_arm and self.aa_arm not in self.arms:
                problems.append(f"aa_arm {self.aa_arm!r} is not one of the arms")
            if self.aa_of and (not self.aa_arm or self.aa_of not in self.arms):
                problems.append(f"aa_of {self.aa_of!r}: one of the arms, with aa_arm")
        if self.screen and (len(self.screen) != 2 or not 0 <= self.screen[0] <= self.screen[1] <= 1):
            problems.append(f"screen = {self.screen}: [low, high] with 0 <= low <= high <= 1")
        if self.kind == "seeds" and (self.aa_arm or self.aa_of):
            problems.append("aa_arm and aa_of are for kind = 'ab'")
        if self.kind != "ab" and (self.arms or self.budget or self.baseline or self.target_heldout is not None or self.eval_every is not None
              or self.to_budget):
            problems.append("arms, budget, baseline, target_heldout, eval_every and to_budget are for kind = 'ab'")
        return problems

    def overrides(self) -> list[str]:
        """`set`, the pinned task ranges, the range and the verdict's name: what every run of the verdict gets besides
        its seed and folder."""
        return [*self.set, *(f"eval.ranges.{name}={size}" for name, size in self.ranges.items()), f'eval.range="{self.range}"',
                *([f'eval.verdict="{self.name}"'] if self.name else [])]

    def unpinned(self) -> list[str]:
        """Settings the verdict reads but leaves to the defaults (the runner refuses to run it so)."""
        return [] if self.ranges else ["ranges (eval.ranges: the task ranges every held-out figure is cut by)"]


def load_verdict(path: Path) -> Verdict:
    """Read and check a verdict file; every problem is listed in one ConfigError."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such verdict file"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    try:
        verdict = msgspec.convert(data, Verdict)
    except msgspec.ValidationError as exc:
        raise ConfigError([f"{path}: {exc}"]) from None
    verdict = msgspec.structs.replace(verdict, name=path.stem)  # its name is its file's, whatever the file says
    if problems := verdict.problems():
        raise ConfigError([f"{path}: {p}" for p in problems])
    return verdict


def result_paths(path: Path) -> tuple[Path, Path]:
    """Where a verdict's result goes: `<name>.result.md` and `<name>.result.json` beside the file."""
    return path.with_suffix(".result.md"), path.with_suffix(".result.json")


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return out or None


def declared_commit(path: Path) -> str | None:
    """The commit that last changed the verdict file, if the file is committed as it stands (else None)."""
    root = path.resolve().parent
    if _git(root, "status", "--porcelain", "--", str(path.resolve())) is not None:
        return None  # modified or untracked: not declared as it is
    return _git(root, "log", "-1", "--format=%H", "--", str(path.resolve()))


def head_commit(root: Path) -> str | None:
    """The commit the runs are made at, with "+dirty" when the working tree differs from it."""
    head = _git(root, "rev-parse", "HEAD")
    if head is None:
        return None
    return head + ("+dirty" if _git(root, "status", "--porcelain", "--untracked-files=no") else "")
