"""What a failed run tells its user: one readable paragraph naming the stage that failed, and the checkpoint.

`failure_message` flattens Trio's exception groups to their leaves and names each by the stage that
raised it (a `StageFailed` says so itself; otherwise the innermost project frame's file decides).
"""

from __future__ import annotations

import errno
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.stage import StageFailed
from stages.policy.base import PolicyStopped

if TYPE_CHECKING:
    from . import resume


class RunRefused(Exception):
    """The run cannot start as asked, through no stage's fault: no Ray cluster at `placement.address`, a checkpoint
    that cannot be read. The message is one line saying what to do; `run.py` exits 2 (bad configuration or usage)."""


def save_on_failure(checkpointer: resume.Checkpointer) -> str:
    """Write the latest checkpoint after a failure; says what was kept (for `failure_message`)."""
    try:
        version = checkpointer.write()
    except OSError as exc:
        return f"the checkpoint could not be written either ({exc}); the previous one, if any, is intact"
    return f"checkpoint at update {version} kept" if version is not None else "no update had finished (no checkpoint)"


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def failure_message(exc: BaseException, run_dir: Path, saved: str) -> str:
    """One readable paragraph: which stage failed (by the file that raised), what, and what to do. A
    `PolicyStopped` beside another failure is its consequence (the policy's server or workers went away with
    the run) and is left out."""
    lines = []
    leaves = _leaves(exc)
    causes = [leaf for leaf in leaves if not isinstance(leaf, PolicyStopped)]
    for leaf in causes or leaves:
        if isinstance(leaf, StageFailed):  # the stage said what went wrong
            lines.append(str(leaf))
            continue
        if isinstance(leaf, OSError) and leaf.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            lines.append(f"the disk of the run folder is full ({leaf.strerror}{': ' + str(leaf.filename) if leaf.filename else ''})")
            continue
        frames = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno}"
                  for f in reversed(traceback.extract_tb(leaf.__traceback__))
                  if "/site-packages/" not in f.filename and "/lib/python" not in f.filename]  # innermost first
        stage = next((s for s in map(_stage_of, frames) if s is not None), "the run")
        lines.append(f"{stage} failed: {type(leaf).__name__}: {leaf} (at {frames[0] if frames else '?'})")
    return "; ".join(lines) + f". {saved}; after fixing it, continue with `python run.py resume {run_dir}`"


def _stage_of(where: str) -> str | None:
    for fragment, stage in (("learner/", "the learner"), ("torch_tiny/", "the policy server"), ("gate", "the gate stage"),
                            ("rollout", "the rollout stage"), ("envs/", "the environment"), ("allocators/", "the allocator")):
        if where.startswith(fragment) or f"/{fragment}" in where or fragment in where.split(":")[0]:
            return stage
    return None
