"""The zero-variance gate offline: fit its models on recorded groups, and score them on others.

Recorded groups (`gates.calibration.RecordedGroup`: rolled out to the end, nothing cut) are replayed through
a `ZeroVarianceGate` whose every group is in the unbiased sample, so each keeps its features at every
checkpoint it reached (and where in its stream that checkpoint was decided). `fit_offline` fits one model
per checkpoint on them (`SavedModels`: the gate's `model` option starts from it); `score_offline` replays
other groups against such models with the gate's rule (the first checkpoint whose p passes its threshold
cuts, never a group with a member seen winning) and counts, per checkpoint, the cuts, their precision and
the env steps they save (every step of the group after the deciding event).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from pipeline.contracts import Task
from pipeline.messages import GroupOpened

from .calibration import RecordedGroup, saved_after
from .zero_variance import SavedModels, ZeroVarianceGate
from .zero_variance_features import feature_names
from .zero_variance_model import FitSettings, fit_checkpoint, probability


@dataclass(frozen=True, slots=True)
class Replayed:
    """One recorded group as the gate saw it."""

    label: bool | None
    features: dict[int, list[float]]
    """k -> features (k = 0: the prompt side); only checkpoints reached with no member seen winning."""
    decided_at: dict[int, int]
    """k -> index of the event after which checkpoint k was decided."""
    steps: int
    """Env steps of the whole group."""


def replay(groups: Sequence[RecordedGroup], tasks: Mapping[str, Task], options: ZeroVarianceGate.Options) -> tuple[list[Replayed], list[str]]:
    """Every group through one gate, in order (the family success rate grows as labels come); also returns the
    task feature names (the gate's order)."""
    gate = ZeroVarianceGate(msgspec.structs.replace(options, warmup=len(groups) + 1, explore=0.0, model=""))
    out = []
    for gid, group in enumerate(groups):
        task = tasks[group.task_id]
        gate.opened(GroupOpened(group_id=gid, task_id=task.task_id, size=group.size, policy_version=0, admitted_at=0.0,
                                family=task.family, split=task.split, features=dict(task.features)))
        decided: dict[int, int] = {}
        for i, event in enumerate(group.events):
            decision = gate.observe(msgspec.structs.replace(event, group_id=gid))  # recorded under the recording's ids
            if decision is not None:
                decided.setdefault(decision.checkpoint, i)
        gate.close(gid)
        kept = gate._awaiting[-1][1]  # the group as the gate kept it for its label
        label = group.label()
        out.append(Replayed(label, dict(kept.features), decided, sum(group.lengths())))
        gate.labelled(gid, [r for r, ok in zip(group.rewards, group.complete, strict=True) if ok])
    return out, list(gate._task_names or [])


def fit_offline(replayed: Sequence[Replayed], task_features: Sequence[str], options: ZeroVarianceGate.Options) -> SavedModels:
    """One model per checkpoint (with its threshold for `options.min_precision`) on labelled replayed groups."""
    settings = FitSettings(options.min_precision, options.min_flagged, cut_allowed=True, confidence=options.confidence)
    models, kept = {}, {}
    for k in [0, *sorted({*options.checkpoints, *([options.k] if options.k else [])})]:
        rows = [(r.features[k], r.label) for r in replayed if r.label is not None and k in r.features]
        model = fit_checkpoint([x for x, _ in rows], [y for _, y in rows], settings)
        if model is not None:
            models[k] = model
        kept[k] = [(list(x), bool(y)) for x, y in rows]
    return SavedModels(features=feature_names(task_features), task_features=list(task_features), models=models, rows=kept)


@dataclass
class CheckpointScore:
    cut: int = 0
    true_positive: int = 0
    positives: int = 0
    """Zero-variance groups that reached this checkpoint undecided (recall's denominator)."""
    steps_saved: int = 0


def score_offline(saved: SavedModels, groups: Sequence[RecordedGroup], replayed: Sequence[Replayed]) -> tuple[dict[int, CheckpointScore], int]:
    """Per checkpoint: cuts made there by the gate's rule, how many were zero-variance, how many zero-variance
    groups were still undecided there, and the env steps saved; also the env steps of all groups."""
    scores: dict[int, CheckpointScore] = {k: CheckpointScore() for k in sorted(saved.models)}
    for group, r in zip(groups, replayed, strict=True):
        for k, score in scores.items():
            if k not in r.features:
                continue
            score.positives += bool(r.label)
            model = saved.models[k]
            if model.threshold is None or probability(model, r.features[k]) < model.threshold:
                continue
            score.cut += 1
            score.true_positive += bool(r.label)
            score.steps_saved += r.steps if k == 0 else saved_after(group, r.decided_at.get(k))[0]
            break
    return scores, sum(r.steps for r in replayed)
