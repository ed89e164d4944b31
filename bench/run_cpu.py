"""What did the machine give each run? CPU per unit of work, read from finished run folders.

    .venv/bin/python bench/run_cpu.py runs/verdict-cost-study/ab          # every run folder of a study
    .venv/bin/python bench/run_cpu.py runs/a runs/b                        # these runs

Per run: the decoders' CPU milliseconds per env step and the learner's CPU seconds per update (each stage's
`cpu_pct` in profile_table.json over the profile's wall clock), the whole process's CPU share, and the phase's
machine load and others' CPU from summary.json. Arms of one study on one machine do the same work per env step
and per update (the same model and batch), so these should agree within a few per cent; a run far off says the
host gave it less (another tenant, a slower machine) — a diagnostic for wall-clock ratios, never a filter: the
harness's own rule (`machine_loaded`) decides which runs are redone.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cpu_figures(summary: Mapping[str, Any], table: Mapping[str, Any]) -> dict[str, float | None]:
    """CPU per unit of work of one run (None where the run did none of that work or did not record it)."""
    wall = table.get("wall_s")
    rows = {row["stage"]: row for row in table.get("rows", [])}

    def cpu_s(stage: str) -> float | None:
        pct = rows.get(stage, {}).get("cpu_pct")
        return None if pct is None or not wall else pct / 100 * wall

    steps, updates = summary.get("env_steps") or 0, summary.get("learner_updates") or 0
    policy, learner = cpu_s("policy"), cpu_s("learner")
    return {
        "policy_cpu_ms_per_env_step": None if policy is None or not steps else 1000 * policy / steps,
        "learner_cpu_s_per_update": None if learner is None or not updates else learner / updates,
        "process_cpu_pct": table.get("process_cpu_pct"),
        "load_1m_mean": summary.get("load_1m_mean"),
        "other_cpu_cores": summary.get("other_cpu_cores"),
    }


def run_folders(paths: list[Path]) -> list[Path]:
    """The run folders named, or those directly inside a study folder (set-aside ones left out)."""
    found = []
    for path in paths:
        if (path / "summary.json").is_file():
            found.append(path)
            continue
        found += sorted(p for p in path.iterdir() if (p / "summary.json").is_file() and "." not in p.name)
    return found


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(folders: list[Path]) -> str:
    lines = ["| run | env steps | policy CPU ms / env step | learner CPU s / update | process CPU % | load 1 min | others' cores |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for folder in folders:
        summary = json.loads((folder / "summary.json").read_text())
        profile = folder / "profile_table.json"
        figures = cpu_figures(summary, json.loads(profile.read_text()) if profile.is_file() else {})
        lines.append(
            f"| {folder.name} | {summary.get('env_steps', '-')} | {_cell(figures['policy_cpu_ms_per_env_step'], '.2f')} "
            f"| {_cell(figures['learner_cpu_s_per_update'], '.2f')} | {_cell(figures['process_cpu_pct'], '.0f')} "
            f"| {_cell(figures['load_1m_mean'], '.2f')} | {_cell(figures['other_cpu_cores'], '.3f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", type=Path, nargs="+", help="run folders, or study folders holding them")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.is_dir()]
    if missing:
        print(f"run_cpu: no such folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    folders = run_folders(args.paths)
    if not folders:
        print("run_cpu: no finished run (summary.json) in " + ", ".join(map(str, args.paths)), file=sys.stderr)
        return 2
    print(table(folders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
