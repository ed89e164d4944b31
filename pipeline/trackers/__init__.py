"""Experiment trackers: sinks for the run's figures where people already look (TensorBoard, W&B, MLflow).

A run names its trackers in `run.trackers = ["tensorboard", "wandb", "mlflow"]`; each one's options are
its own table, `[trackers.<name>]`, decoded strictly into the tracker's `Options` (`pipeline.plugins`).
Trackers are registered in `TRACKERS` (entry-point group `rollcut.trackers`) like every extension point,
and built as `Tracker(options, run=TrackerRun)`.

They are given what the run folder already holds, as it is written: every metrics.jsonl row (per-update
figures and held-out rows, `MetricsWriter`'s sinks, x axis = the learner version), the resolved config as
parameters (at open), and at the end the summary's figures and the run's images (profile.png,
learning_curve.png). A tracker whose package is missing is a configuration error naming the extra
(`tracker_problems`, exit 2 before the warm start).

Resume: `trackers.json` in the run folder holds each tracker's run id; `run.py resume` reopens the same
tracker run and appends (TensorBoard also discards the steps after the checkpoint, as metrics.jsonl
does). A tracker that fails while the run goes on is logged (`tracker.failed`) and dropped: the run and
its own files do not depend on it.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec
import structlog

from ..config import RunConfig, dump_toml
from ..plugins import build_plugin, option_problems
from ..registry import Registry
from ._rows import flat_params, scalars, summary_scalars, tracker_row

__all__ = [
    "IDS_FILE",
    "TRACKERS",
    "Tracker",
    "TrackerRun",
    "Trackers",
    "flat_params",
    "scalars",
    "summary_scalars",
    "finish_run",
    "open_run_trackers",
    "tracker_problems",
    "tracker_row",
]

log = structlog.get_logger(__name__)

TRACKERS = Registry(
    "trackers",
    {
        "tensorboard": "pipeline.trackers._tensorboard:TensorBoardTracker",
        "wandb": "pipeline.trackers._wandb:WandbTracker",
        "mlflow": "pipeline.trackers._mlflow:MlflowTracker",
    },
)

IDS_FILE = "trackers.json"
"""In the run folder: {tracker name: its run id}, what `run.py resume` reopens."""


@dataclass(frozen=True)
class TrackerRun:
    """What a tracker is opened with."""

    run_dir: Path
    name: str
    """The run folder's name (a tracker's default run name)."""
    config: Mapping[str, Any]
    """The resolved config, as nested builtins."""
    config_toml: str
    resume_id: str | None = None
    """The tracker run a resumed run appends to (from `trackers.json`); None for a new run."""
    resume_step: int | None = None
    """Resuming: the checkpoint's learner version. Rows after it were dropped from metrics.jsonl and are
    logged again."""


class Tracker(Protocol):
    """A tracker sink. Every method is called from the run's Trio thread, in order; `close` last."""

    run_id: str
    """What `trackers.json` keeps, so a resumed run reopens this tracker run."""

    def log_row(self, values: Mapping[str, float], step: int) -> None:
        """One metrics row's numbers at learner version `step`."""

    def log_summary(self, figures: Mapping[str, float], step: int) -> None:
        """The summary's numbers (`summary/...`), once, after the run."""

    def log_image(self, name: str, path: Path, step: int) -> None:
        """A PNG of the run folder (`profile`, `learning_curve`), after the run."""

    def close(self, ok: bool) -> None:
        """Flush and end the tracker run (`ok` False: the run failed or was interrupted)."""


def required_packages(tracker: Any) -> tuple[str, ...]:
    """The import names a tracker class needs (`requires`), and the extra that installs them (`extra`)."""
    return tuple(getattr(tracker, "requires", ()))


def tracker_problems(names: Sequence[str], options: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every problem with `run.trackers` and the `[trackers.<name>]` tables: unknown or repeated names, a
    missing package (naming the extra that installs it), bad options, options for a tracker not chosen."""
    problems: list[str] = []
    for name in sorted({n for n in names if list(names).count(n) > 1}):
        problems.append(f"run.trackers: {name!r} is named more than once")
    for name in dict.fromkeys(names):
        found = TRACKERS.check(name, "run.trackers")
        if found:
            problems += found
            continue
        tracker = TRACKERS.get(name)
        missing = [m for m in required_packages(tracker) if importlib.util.find_spec(m) is None]
        if missing:
            extra = getattr(tracker, "extra", name)
            problems.append(
                f"run.trackers: {name!r} needs the {', '.join(missing)} package{'s' if len(missing) > 1 else ''}: "
                f"pip install 'rollcut[{extra}]'"
            )
        problems += option_problems(tracker, options.get(name, {}), f"trackers.{name}", f"tracker {name!r}")
    for name in sorted(set(options) - set(names)):
        problems.append(f"trackers.{name}: options for a tracker that run.trackers does not name")
    return problems


class Trackers:
    """The run's trackers, fed together. Empty (no tracker chosen) it does nothing."""

    def __init__(self, trackers: Mapping[str, Tracker] | None = None, run_dir: Path | None = None) -> None:
        self._trackers = dict(trackers or {})
        self._run_dir = run_dir
        self.step = 0
        """The last learner version a row was logged at (the summary and images go there)."""

    @classmethod
    def open(cls, names: Iterable[str], options: Mapping[str, Mapping[str, Any]], run: TrackerRun) -> Trackers:
        """Build each named tracker (resuming the tracker run `trackers.json` names, if any) and record the
        run ids. Raises whatever a tracker raises at start (the run has not begun: it fails there)."""
        ids = read_ids(run.run_dir) if run.resume_step is not None else {}
        opened: dict[str, Tracker] = {}
        try:
            for name in names:
                this = TrackerRun(run.run_dir, run.name, run.config, run.config_toml, ids.get(name), run.resume_step)
                opened[name] = build_plugin(TRACKERS.get(name), options.get(name, {}), f"trackers.{name}",
                                            f"tracker {name!r}", run=this)
        except BaseException:
            for tracker in opened.values():
                tracker.close(False)
            raise
        trackers = cls(opened, run.run_dir)
        trackers.step = run.resume_step or 0
        if opened:
            (run.run_dir / IDS_FILE).write_text(json.dumps({n: t.run_id for n, t in opened.items()}, indent=2) + "\n")
        return trackers

    @property
    def names(self) -> list[str]:
        return list(self._trackers)

    def log_row(self, row: Mapping[str, Any]) -> None:
        """One metrics.jsonl row (`tracker_row`: numbers only, held-out figures under `heldout/`)."""
        if not self._trackers:
            return
        step, values = tracker_row(row)
        self.step = max(self.step, step)
        self._each("log_row", values, step)

    def finish(self, figures: Mapping[str, Any], images: Mapping[str, Path]) -> None:
        """The summary's figures and the images that exist, at the last step logged."""
        self._each("log_summary", summary_scalars(figures), self.step)
        for name, path in images.items():
            if path.exists():
                self._each("log_image", name, path, self.step)

    def close(self, ok: bool) -> None:
        for name in list(self._trackers):
            self._each("close", ok, only=name)
        self._trackers.clear()

    def _each(self, method: str, *args: Any, only: str | None = None) -> None:
        for name, tracker in list(self._trackers.items()):
            if only is not None and name != only:
                continue
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # a tracker never stops the run; it is dropped, loudly
                log.warning("tracker.failed", tracker=name, during=method, error=f"{type(exc).__name__}: {exc}",
                            note="this tracker gets nothing more; the run folder has every figure")
                self._trackers.pop(name, None)
                if method != "close":
                    try:
                        tracker.close(False)
                    except Exception:  # already failed; the warning above said so
                        pass


def open_run_trackers(cfg: RunConfig, run_dir: Path, *, resume_step: int | None) -> Trackers:
    """The trackers `cfg.run.trackers` names, opened for the run in `run_dir` (`resume_step`: the version a
    resumed run continues from; None for a new run)."""
    if not cfg.run.trackers:
        return Trackers()
    run = TrackerRun(run_dir, run_dir.name, msgspec.to_builtins(cfg), dump_toml(cfg), resume_step=resume_step)
    return Trackers.open(cfg.run.trackers, cfg.trackers, run)


IMAGES = {"profile": "profile.png", "learning_curve": "learning_curve.png"}
"""The run folder's images a tracker gets at the end, by name."""


def finish_run(trackers: Trackers, run_dir: Path, *, since: float, ok: bool) -> None:
    """After the job: the summary's figures and the images, if this job wrote them (modified at or after
    `since`, a `time.time()`: a resumed run that fails early must not report the last run's summary), then
    close every tracker (`ok` False: failed or interrupted)."""
    if not trackers.names:
        return
    written = {name: run_dir / file for name, file in IMAGES.items()}
    written = {name: path for name, path in written.items() if path.exists() and path.stat().st_mtime >= since}
    summary = run_dir / "summary.json"
    figures = json.loads(summary.read_text()) if summary.exists() and summary.stat().st_mtime >= since else {}
    if figures or written:
        trackers.finish(figures, written)
    trackers.close(ok)


def read_ids(run_dir: Path) -> dict[str, str]:
    """`trackers.json` of a run folder ({} when it has none)."""
    path = run_dir / IDS_FILE
    return json.loads(path.read_text()) if path.exists() else {}
