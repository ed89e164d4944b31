"""The zero-variance gate: predict, at admission and at early checkpoints, whether a group will end with
zero reward variance, from a model refit online on the stream's own unbiased labels; cut at a threshold
whose measured precision meets the target.

At each checkpoint k in `checkpoints` (default 2, 4, 6, 8, 10, 15, 20; k = 0 is admission, asked by the
allocator's admission loop through `AdmissionScreen`), the gate computes the group's features
(`gates.zero_variance_features`: the prompt side and the members' steps before k) and p = P(zero
variance) from that checkpoint's logistic model (`gates.zero_variance_model.probability`, a dot product).
It cuts iff p >= the checkpoint's threshold, and never:

* a group some member has already won (reward > 0 seen): it cannot end all-fail, and an all-succeed
  group is not worth a false cut of a mixed one;
* a group of the *unbiased sample*: the groups opened while the warm-up lasts (fewer than `warmup`
  unbiased labels so far) and, after it, a seeded `explore` fraction of groups chosen at admission
  (`explored(seed, group_id)`, and at k = 0 the screen's own draw for a prompt it would skip);
* before a threshold exists: none does until `warmup` unbiased labels are in, and one exists at a
  checkpoint only when some threshold's precision on the unbiased sample (out of fold) is at least
  `min_precision` with at least `min_flagged` groups above it.

Labels. Only the unbiased sample trains the model and measures precision. A cut group's label is unknown
(the gate stage never labels it). An uncut group outside the sample is not used either: it reached its
label only because the gate declined to cut it at every checkpoint, so the groups that did get cut -
mostly zero-variance - are missing from the uncut ones, and whether a group was cut depends on its
features at later checkpoints than the one being trained; those labels are missing not at random and would
teach the early checkpoints that zero-variance groups are rarer than they are (and flatter the precision
measured on them). Every uncut label still updates the family's success rate, a prompt-side *feature*,
whose value is the same wherever it is read.

Refit: every `refit_every` new unbiased labels, `serve()` (started by the gate stage) fits every
checkpoint's model in a worker thread (`trio.to_thread`); decisions meanwhile use the previous models.
`model` names a JSON file of models fitted offline (`bench/calibrate_gate.py --fit-zero-variance`) to
start from; its thresholds are not used before the warm-up ends.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import trio

from pipeline.contracts import Task
from pipeline.messages import GroupOpened, RolloutFailed, StepEvent
from pipeline.outcomes import zero_variance_label

from .base import Checkpoint
from .prefix import GateDecision
from .zero_variance_features import STEP_FEATURES, MemberSteps, feature_vector, prompt_vector
from .zero_variance_model import FitSettings, LinearModel, fit_checkpoint, probability, wilson_interval

Fraction = Annotated[float, msgspec.Meta(ge=0, lt=1)]
_STEP_COUNT = len(STEP_FEATURES)


def explored(seed: int, group_id: int, fraction: float) -> bool:
    """Whether group `group_id` is in the seeded exploration sample (never cut): a pure hash of (seed, id)."""
    digest = hashlib.blake2b(f"{seed}:{group_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


class SavedModels(msgspec.Struct, frozen=True, kw_only=True):
    """Models fitted offline, per checkpoint, over the features named in `features` (JSON on disk)."""

    features: list[str]
    task_features: list[str]
    models: dict[int, LinearModel]
    rows: dict[int, list[tuple[list[float], bool]]] = {}
    """k -> the labelled features they were fitted on (recordings cut nothing: unbiased). A gate started from
    this file fits every refit on these and its own unbiased sample together."""


@dataclass(slots=True)
class _Counts:
    """Live precision / recall of one checkpoint's decisions on the unbiased sample."""

    tp: int = 0
    fp: int = 0
    fn: int = 0
    tn: int = 0

    def add(self, flagged: bool, positive: bool) -> None:
        if flagged:
            self.tp += positive
            self.fp += not positive
        else:
            self.fn += positive
            self.tn += not positive


@dataclass(slots=True)
class _Group:
    prompt: list[float]
    family: str
    members: list[MemberSteps]
    pending: list[int]
    never_cut: bool
    won: bool = False
    decisions: list[GateDecision] = field(default_factory=list)
    features: dict[int, list[float]] = field(default_factory=dict)
    """k -> features, kept for the unbiased sample's training rows."""
    flagged: dict[int, bool] = field(default_factory=dict)
    """k -> the live rule would have cut here (only where a threshold existed)."""


class ZeroVarianceGate:
    """Cut a group predicted to end with zero variance at the target precision (see the module docstring)."""

    name = "zero_variance"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        checkpoints: list[Checkpoint] = msgspec.field(default_factory=lambda: [2, 4, 6, 8, 10, 15, 20])
        """The in-flight checkpoints k (admission, k = 0, is `admission`)."""
        k: Checkpoint | None = None
        """`gate.k`: one more checkpoint."""
        tau: float | None = None
        """Not used: the thresholds follow from `min_precision` (refused when set)."""
        min_precision: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.95
        """A checkpoint's threshold is the lowest whose precision on the unbiased sample reaches this."""
        min_flagged: Annotated[int, msgspec.Meta(ge=1)] = 10
        """...with at least this many unbiased groups above it."""
        confidence: Annotated[float, msgspec.Meta(ge=0, lt=1)] = 0.9
        """...at this one-sided confidence (the Wilson lower bound of the precision reaches `min_precision`);
        0 = the point estimate. Chosen on dev (docs/gate.md): with the point estimate the live precision fell
        far below the target."""
        explore: Fraction = 0.1
        """The fraction of groups never cut after the warm-up (their labels are the unbiased sample)."""
        warmup: Annotated[int, msgspec.Meta(ge=1)] = 64
        """Unbiased labels before any cut; every group opened until then is in the unbiased sample."""
        refit_every: Annotated[int, msgspec.Meta(ge=1)] = 16
        """New unbiased labels between refits."""
        window: Annotated[int, msgspec.Meta(ge=8)] = 2000
        """The latest unbiased labels a refit uses, per checkpoint."""
        admission: bool = True
        """Skip prompts predicted zero-variance before they start (k = 0; where the allocator can skip)."""
        stall_window: Annotated[int, msgspec.Meta(ge=1)] = 5
        """How many of a running member's latest steps the progress feature reads (the stall gate's window)."""
        family_decay: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.98
        """Per labelled group of a family, the weight its earlier groups keep in its success rate."""
        seed: int = 0
        """Seeds the exploration sample."""
        model: str = ""
        """A JSON file of models fitted offline (`SavedModels`) to start from; "" = none."""

        def __post_init__(self) -> None:
            if self.tau is not None:
                raise ValueError("the zero_variance gate sets its thresholds from min_precision: leave gate.tau unset")


    def __init__(self, options: Options = Options()) -> None:  # noqa: B008 (a frozen Struct)
        if importlib.util.find_spec("sklearn") is None:
            raise ValueError("the zero_variance gate refits with scikit-learn: pip install scikit-learn")
        self.options = options
        self.checkpoints = sorted({*options.checkpoints, *([options.k] if options.k else [])})
        self.ks = [0, *self.checkpoints]
        self._groups: dict[int, _Group] = {}
        self._awaiting: deque[tuple[int, _Group]] = deque(maxlen=4096)
        """Closed groups waiting for their label: (group id, group)."""
        self._data: dict[int, deque[tuple[list[float], bool]]] = {k: deque(maxlen=options.window) for k in self.ks}
        self._prior: dict[int, list[tuple[list[float], bool]]] = {}
        """k -> the offline rows of `model` (`SavedModels.rows`): every refit fits on them as well."""
        self._models: dict[int, LinearModel] = {}
        self._live = {k: _Counts() for k in self.ks}
        self._overall = _Counts()
        self._families: dict[str, tuple[float, float]] = {}  # family -> (decayed successes, decayed rollouts)
        self._task_names: list[str] | None = None
        self._admission_explore: set[int] = set()
        self._admission_flag: dict[int, tuple[bool, list[float]]] = {}
        self.unbiased_labels = 0
        self.admission_screened = self.admission_skipped = 0
        self.labels_unused = 0
        self.refits = 0
        self.refitting = False
        self._since_refit = 0
        self._refit_due = trio.Event()
        self.refit_done = trio.Event()
        self.fit: Callable[[Sequence[Sequence[float]], Sequence[bool], FitSettings], LinearModel | None] = fit_checkpoint
        """The fitting function (a worker thread calls it): swappable for tests."""
        if options.model:
            saved = msgspec.json.decode(Path(options.model).read_bytes(), type=SavedModels)
            self._task_names = list(saved.task_features)
            self._models = {k: msgspec.structs.replace(m, threshold=None) for k, m in saved.models.items() if k in self.ks}
            self._prior = {k: [(list(x), bool(y)) for x, y in rows] for k, rows in saved.rows.items() if k in self.ks}

    # ----------------------------------------------------------------------------------------------
    # The prompt side

    def family_success(self, family: str) -> float:
        successes, rollouts = self._families.get(family, (0.0, 0.0))
        return (successes + 0.5) / (rollouts + 1.0)

    def prompt_features(self, family: str, split: str, policy_version: int, features: Mapping[str, float]) -> list[float]:
        if self._task_names is None:
            self._task_names = sorted(features)
        return prompt_vector(self.family_success(family), split, policy_version, features, self._task_names)

    @property
    def warmed_up(self) -> bool:
        return self.unbiased_labels >= self.options.warmup

    def _threshold(self, k: int) -> tuple[LinearModel | None, float | None]:
        model = self._models.get(k)
        if model is None or model.threshold is None or not self.warmed_up:
            return model, None
        return model, model.threshold

    # ----------------------------------------------------------------------------------------------
    # Admission (k = 0)

    def screen(self, task: Task, policy_version: int, draw: float) -> tuple[bool, bool, list[float]]:
        """Skip this prompt? Returns (skip, flagged, its features): `flagged` when p_0 passes the admission
        threshold; `draw` in [0, 1) overrules a flagged prompt's skip when draw < explore (it then runs in
        the unbiased sample)."""
        x = self.prompt_features(task.family, task.split, policy_version, task.features) + [0.0] * _STEP_COUNT
        model, threshold = self._threshold(0)
        flagged = model is not None and threshold is not None and probability(model, x) >= threshold
        skip = flagged and draw >= self.options.explore
        self.admission_screened += 1
        self.admission_skipped += skip
        return skip, flagged, x

    def admitted(self, group_id: int, flagged: bool, features: list[float]) -> None:
        """A screened prompt was admitted as `group_id`; `flagged`: the screen would have skipped it (so it is
        in the unbiased sample: never cut)."""
        if flagged:
            self._admission_explore.add(group_id)
        self._admission_flag[group_id] = (flagged, features)
        while len(self._admission_flag) > 4096:
            self._admission_flag.pop(next(iter(self._admission_flag)))

    # ----------------------------------------------------------------------------------------------
    # The gate contract (gates.base.Gate) and the learning hooks (gates.base.LearningGate)

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    def opened(self, message: GroupOpened) -> None:
        """The prompt side of a group about to open (the gate stage calls this before `open`)."""
        prompt = self.prompt_features(message.family, message.split, message.policy_version, message.features)
        self._open(message.group_id, message.size, prompt, message.family)

    def open(self, group_id: int, size: int) -> None:
        if group_id not in self._groups:  # opened without its prompt side (an offline replay)
            self._open(group_id, size, self.prompt_features("", "", 0, {}), "")

    def _open(self, group_id: int, size: int, prompt: list[float], family: str) -> None:
        never_cut = (not self.warmed_up or group_id in self._admission_explore
                     or explored(self.options.seed, group_id, self.options.explore))
        self._admission_explore.discard(group_id)
        table: dict[str, str] = {}  # the group's action codes, shared by its members
        group = _Group(prompt, family, [MemberSteps(table) for _ in range(size)], list(self.checkpoints), never_cut)
        if never_cut:
            flagged, x = self._admission_flag.get(group_id, (False, None))
            group.features[0] = x if x is not None else prompt + [0.0] * _STEP_COUNT
            if group_id in self._admission_flag and self._threshold(0)[1] is not None:
                group.flagged[0] = flagged
        self._admission_flag.pop(group_id, None)
        self._groups[group_id] = group

    def close(self, group_id: int) -> list[GateDecision]:
        group = self._groups.pop(group_id, None)
        if group is None:
            return []
        self._awaiting.append((group_id, group))
        return group.decisions

    def observe(self, event: StepEvent | RolloutFailed) -> GateDecision | None:
        group = self._groups.get(event.group_id)
        if group is None or not 0 <= event.rollout_index < len(group.members):
            return None
        member = group.members[event.rollout_index]
        if isinstance(event, RolloutFailed):
            member.fail()
        else:
            member.add(event)
            group.won |= event.reward > 0
        latest = None
        while group.pending and all(len(m) >= group.pending[0] or m.done_at is not None for m in group.members):
            k = group.pending.pop(0)
            if all(m.done_at is not None for m in group.members) and max(map(len, group.members)) < k:
                group.pending.clear()  # every member ended before k: never evaluated
                break
            latest = self._decide(group, k)
            group.decisions.append(latest)
            if latest.cut:
                group.pending.clear()
        return latest

    def _decide(self, group: _Group, k: int) -> GateDecision:
        if group.won:
            return GateDecision(cut=False, value=float("nan"), checkpoint=k, reason=f"zero_variance k={k}: a member won, never cut")
        model, threshold = self._threshold(k)
        if threshold is None and not group.never_cut:  # nothing to decide and no row to keep: skip the features
            return GateDecision(cut=False, value=float("nan"), checkpoint=k, reason=f"zero_variance k={k}: no threshold yet")
        x = feature_vector(group.prompt, group.members, k, self.options.stall_window)
        p = probability(model, x) if model is not None else float("nan")
        flagged = threshold is not None and p >= threshold
        if group.never_cut:
            group.features[k] = x
            if threshold is not None:
                group.flagged[k] = flagged
            return GateDecision(cut=False, value=p, checkpoint=k, reason=f"zero_variance p_{k}={p:.3f}: unbiased sample, never cut")
        relation = ">=" if flagged else "<"
        return GateDecision(cut=flagged, value=p, checkpoint=k, reason=f"zero_variance p_{k}={p:.3f} {relation} {threshold:.3f}")

    def labelled(self, group_id: int, rewards: Sequence[float]) -> None:
        """A group's settled outcome (never a cut group's: the gate stage discards those). Only a group of the
        unbiased sample trains the model and scores the live precision."""
        label = zero_variance_label(rewards)
        found = next((g for gid, g in self._awaiting if gid == group_id), None)
        if found is None or label is None:
            return
        self._awaiting.remove((group_id, found))
        s, n = self._families.get(found.family, (0.0, 0.0))
        decay = self.options.family_decay
        self._families[found.family] = (s * decay + sum(r > 0 for r in rewards), n * decay + len(rewards))
        if not found.never_cut:
            self.labels_unused += 1
            return
        self.unbiased_labels += 1
        for k, x in found.features.items():
            self._data[k].append((x, label))
        for k, flagged in found.flagged.items():
            self._live[k].add(flagged, label)
        if found.flagged:
            self._overall.add(any(found.flagged.values()), label)
        self._since_refit += 1
        if self._since_refit >= self.options.refit_every:
            self._since_refit = 0
            self._refit_due.set()

    # ----------------------------------------------------------------------------------------------
    # Refitting, off the event loop

    def _snapshot(self) -> tuple[dict[int, tuple[list[list[float]], list[bool]]], FitSettings]:
        data = {k: ([x for x, _ in [*self._prior.get(k, ()), *rows]], [y for _, y in [*self._prior.get(k, ()), *rows]])
                for k, rows in self._data.items()}
        settings = FitSettings(self.options.min_precision, self.options.min_flagged, cut_allowed=self.warmed_up,
                               confidence=self.options.confidence)
        return data, settings

    def _fit_all(self, data: Mapping[int, tuple[list[list[float]], list[bool]]], settings: FitSettings) -> dict[int, LinearModel]:
        fitted = {}
        for k, (xs, ys) in data.items():
            model = self.fit(xs, ys, settings)
            if model is not None:
                fitted[k] = model
        return fitted

    def install(self, models: Mapping[int, LinearModel]) -> None:
        """Use these models from now on (a refit's result; a test's own)."""
        self._models.update(models)

    def refit_now(self) -> None:
        """Refit on this thread (offline replays; the run refits in `serve`)."""
        self.install(self._fit_all(*self._snapshot()))
        self.refits += 1

    async def serve(self) -> None:
        """Refit whenever `labelled` asks, in a worker thread; the loop keeps deciding with the old models."""
        while True:
            await self._refit_due.wait()
            self._refit_due = trio.Event()
            self.refitting = True
            try:
                fitted = await trio.to_thread.run_sync(self._fit_all, *self._snapshot(), abandon_on_cancel=True)
            finally:
                self.refitting = False
            self.install(fitted)
            self.refits += 1
            self.refit_done.set()
            self.refit_done = trio.Event()

    # ----------------------------------------------------------------------------------------------
    # A resumed run (`gates.base.ResumableLearningGate`): what it learned, as plain data

    def state_dict(self) -> dict[str, Any]:
        """The unbiased sample's rows, the fitted models, the live counts and the family success rates; groups in
        flight are not kept (a resume loses them, as it loses their rollouts)."""
        return {
            "data": {str(k): [[x, y] for x, y in rows] for k, rows in self._data.items()},
            "models": {str(k): msgspec.to_builtins(m) for k, m in self._models.items()},
            "live": {str(k): [c.tp, c.fp, c.fn, c.tn] for k, c in self._live.items()},
            "overall": [self._overall.tp, self._overall.fp, self._overall.fn, self._overall.tn],
            "families": {f: list(v) for f, v in self._families.items()},
            "task_names": self._task_names,
            "counts": {k: getattr(self, k) for k in _COUNTS},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for k, rows in state["data"].items():
            if int(k) in self._data:
                self._data[int(k)].extend((list(x), bool(y)) for x, y in rows)
        self._models.update({int(k): msgspec.convert(m, LinearModel) for k, m in state["models"].items() if int(k) in self.ks})
        for k, (tp, fp, fn, tn) in state["live"].items():
            if int(k) in self._live:
                self._live[int(k)] = _Counts(tp, fp, fn, tn)
        self._overall = _Counts(*state["overall"])
        self._families = {f: (float(s), float(n)) for f, (s, n) in state["families"].items()}
        self._task_names = None if state["task_names"] is None else list(state["task_names"])
        for key in _COUNTS:
            setattr(self, key, state["counts"][key])

    # ----------------------------------------------------------------------------------------------
    # Figures

    def report(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {
            "gate/zv/unbiased_labels": self.unbiased_labels,
            "gate/zv/labels_unused": self.labels_unused,
            "gate/zv/refits": self.refits,
            "gate/zv/warmed_up": float(self.warmed_up),
            "gate/zv/admission_screened": self.admission_screened,
            "gate/zv/admission_skipped": self.admission_skipped,
        }
        for name, counts in [(f"@{k}", self._live[k]) for k in self.ks] + [("", self._overall)]:
            flagged, positives = counts.tp + counts.fp, counts.tp + counts.fn
            precision = wilson_interval(counts.tp, flagged)
            recall = wilson_interval(counts.tp, positives)
            out[f"gate/zv/precision{name}"] = counts.tp / flagged if flagged else None
            out[f"gate/zv/precision_lo{name}"] = precision[0] if precision else None
            out[f"gate/zv/precision_hi{name}"] = precision[1] if precision else None
            out[f"gate/zv/recall{name}"] = counts.tp / positives if positives else None
            out[f"gate/zv/recall_lo{name}"] = recall[0] if recall else None
            out[f"gate/zv/recall_hi{name}"] = recall[1] if recall else None
            out[f"gate/zv/flagged{name}"] = flagged
        for k in self.ks:
            model = self._models.get(k)
            out[f"gate/zv/threshold@{k}"] = model.threshold if model is not None and self.warmed_up else None
        return out


_COUNTS = ("unbiased_labels", "labels_unused", "refits", "admission_screened", "admission_skipped", "_since_refit")
"""The gate's running counts a checkpoint keeps."""


class AdmissionScreen:
    """The allocator's question at k = 0, asked by the admission loop (`pipeline.allocation.AdmissionLoop`):
    skip this prompt? Draws its exploration from its own seeded stream."""

    def __init__(self, gate: ZeroVarianceGate, tasks: Mapping[str, Task], version: Callable[[], int]) -> None:
        self.gate, self.tasks, self.version = gate, tasks, version
        self._rng = random.Random(gate.options.seed)
        self._last: tuple[bool, list[float]] | None = None

    def skip(self, task_id: str) -> bool:
        skip, flagged, x = self.gate.screen(self.tasks[task_id], self.version(), self._rng.random())
        self._last = (flagged, x)
        return skip

    def admitted(self, group_id: int, task_id: str) -> None:
        if self._last is not None:
            self.gate.admitted(group_id, *self._last)
        self._last = None
