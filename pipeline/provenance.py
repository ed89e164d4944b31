"""Which code a run ran: the commit of each invocation, appended to the run folder's `commits.jsonl`.

Every invocation of a run (the first, and each `run.py resume`) appends one JSON line before it does anything
else: the commit of the rollcut source tree it ran from (`git rev-parse HEAD`), whether tracked files differed
from it (`dirty`), whether it resumed, and when it started (UTC). Nothing is overwritten, so a run resumed
at another commit names both; `summary.json` repeats the list (`run_commits`). Outside a git checkout (an
installed wheel) the commit and the flag are null.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parents[1]
"""The source tree this module was imported from (the repository root of a checkout)."""
FILE = "commits.jsonl"


def _git(root: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def code_commit(root: Path = SOURCE) -> dict[str, Any]:
    """{"commit": the HEAD commit of `root` (None outside git), "dirty": tracked files differ from it (None outside git)},
    from one `git status` (its porcelain v2 header names the commit; every other line is a changed tracked file): one
    process per invocation, which every run of a study starts."""
    status = _git(root, "status", "--porcelain=v2", "--branch", "--untracked-files=no")
    lines = status.splitlines() if status is not None else []
    head = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if head is None or head == "(initial)":  # outside git, or a repository with no commit yet
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": any(not line.startswith("#") for line in lines)}


def record_invocation(run_dir: Path, *, resumed: bool, root: Path = SOURCE) -> dict[str, Any]:
    """Append this invocation's commit to `run_dir/commits.jsonl`; returns the line written."""
    line = code_commit(root) | {"resumed": resumed, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with (run_dir / FILE).open("a") as f:
        f.write(json.dumps(line) + "\n")
    return line


def invocations(run_dir: Path) -> list[dict[str, Any]]:
    """Every invocation's line, oldest first (a line a crash cut short is skipped)."""
    path = run_dir / FILE
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines
