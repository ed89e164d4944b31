"""Learning-rate schedules: the learner's lr as a function of how far the run is through its updates.

Every schedule has the signature

    schedule(progress, *, floor) -> factor

with `progress` = learner version / `run.updates` in [0, 1] (clamped) and `factor` the multiple of
`learner.lr` for the update about to run: 1 at the start, `floor` (`learner.lr_floor`) at the end. A schedule
is a pure function of the version, so a resumed run continues on the same curve.

Why decay at all: a run that rises by mid-run can give the rise back when late updates are as large as
early ones (docs/learning.md, "The learn preset"); a decaying lr with the published moving average
(`learner.ema`) is the usual way to let the last updates refine rather than move the policy.
"""

from __future__ import annotations

import math

from pipeline.registry import Registry


def constant(progress: float, *, floor: float) -> float:
    """The same lr for every update."""
    return 1.0


def linear(progress: float, *, floor: float) -> float:
    """From 1 down to `floor` in a straight line over the run's updates."""
    return 1.0 - (1.0 - floor) * _clamped(progress)


def cosine(progress: float, *, floor: float) -> float:
    """From 1 down to `floor` along half a cosine: slow at both ends."""
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * _clamped(progress)))


def lr_factor(name: str, version: int, total_updates: int, floor: float) -> float:
    """The multiple of `learner.lr` for the update that trains learner `version` (0-based) of `total_updates`."""
    return LR_SCHEDULES.get(name)(version / max(total_updates, 1), floor=floor)


def _clamped(progress: float) -> float:
    return min(max(progress, 0.0), 1.0)


LR_SCHEDULES = Registry(
    "lr_schedules",
    {
        "constant": "learner.schedules:constant",
        "linear": "learner.schedules:linear",
        "cosine": "learner.schedules:cosine",
    },
)
