"""The run folder `runs/<name>/`: resolved config, metrics, structured events, summaries.

    config.toml     the resolved configuration (re-runnable with --config)
    metrics.jsonl   one JSON object per learner update (iteration)
    events.jsonl    structlog events (JSON lines) from every stage
    summary.json    the run's figures, machine-readable
    summary.md      the same as tables a person reads
    commits.jsonl   the commit (and dirty flag) of each invocation, a resume appending its own (pipeline/provenance.py)
    profile.json    Chrome/Perfetto trace (pipeline.profiling), profile.png
    checkpoints/    final policy weights and allocator state
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import structlog

from .config import RunConfig, dump_toml


def free_run_name(out: str | Path, name: str) -> str:
    """`name`, or `name-2`, `-3`... whichever is not yet a folder under `out`."""
    candidate, n = name, 2
    while (Path(out) / candidate).exists():
        candidate, n = f"{name}-{n}", n + 1
    return candidate


def create_run_dir(cfg: RunConfig) -> Path:
    """`out/name`, or `out/name-2`, `-3`... if taken: a run never overwrites another."""
    base = Path(cfg.run.out)
    base.mkdir(parents=True, exist_ok=True)
    path = base / free_run_name(base, cfg.run.name)
    path.mkdir()
    (path / "checkpoints").mkdir()
    (path / "config.toml").write_text(dump_toml(cfg))
    return path


def configure_logging(run_dir: Path | None, *, console_level: int = logging.WARNING) -> IO[str] | None:
    """structlog -> JSON lines in events.jsonl (everything) and readable lines on stderr (warnings up)."""
    events = (run_dir / "events.jsonl").open("a", buffering=1) if run_dir is not None else None
    renderer = structlog.processors.JSONRenderer()
    console = structlog.dev.ConsoleRenderer(colors=False)

    def tee(logger: Any, method: str, event: dict[str, Any]) -> str:
        line = renderer(logger, method, dict(event))
        if events is not None:
            events.write(line + "\n")
        if logging.getLevelName(method.upper()) >= console_level:
            print(console(logger, method, dict(event)), file=sys.stderr)
        raise structlog.DropEvent

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            tee,
        ],
        cache_logger_on_first_use=False,
    )
    return events


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class MetricsSink(Protocol):
    """Something else that takes each metrics row as it is written (`pipeline.trackers.Trackers`)."""

    def log_row(self, row: Mapping[str, Any]) -> None: ...


class MetricsWriter:
    """metrics.jsonl, one row per line as it comes (update rows and held-out rows), each also handed to
    `sinks` (the run's experiment trackers)."""

    def __init__(self, run_dir: Path, sinks: Sequence[MetricsSink] = ()) -> None:
        self._file = (run_dir / "metrics.jsonl").open("a", buffering=1)
        self._sinks = list(sinks)

    def write(self, row: Mapping[str, Any]) -> None:
        clean = _clean(dict(row))
        self._file.write(json.dumps(clean, sort_keys=False) + "\n")
        for sink in self._sinks:
            sink.log_row(clean)

    def close(self) -> None:
        self._file.close()


def write_summary(run_dir: Path, summary: Mapping[str, Any], sections: Mapping[str, str]) -> None:
    """summary.json (flat figures) and summary.md (a headline table plus extra markdown sections)."""
    (run_dir / "summary.json").write_text(json.dumps(_clean(dict(summary)), indent=2) + "\n")
    lines = [f"# rollcut run `{run_dir.name}`", "", "| figure | value |", "|---|---|"]
    for key, value in summary.items():
        if isinstance(value, Mapping | list):
            continue
        lines.append(f"| {key} | {_fmt(value)} |")
    for title, body in sections.items():
        lines += ["", f"## {title}", "", body.rstrip()]
    (run_dir / "summary.md").write_text("\n".join(lines) + "\n")


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        return f"{value:.4g}"
    return str(value)
