"""The prefix edit-distance gate of Selective Rollout (Zhai & Wang, arXiv 2605.05802).

Definition (shared/reference/selective_rollout.md §2.2, §2.3, §7), replicated exactly:

* an action is the *parsed* environment command string of one step (not tokens, not characters);
* each rollout's first K actions form its prefix, padded with `<END>` to length K when it ended sooner;
* d_K = mean over all C(G, 2) unordered pairs of Levenshtein(prefix_i, prefix_j) / K, with substitution,
  insertion and deletion all costing 1 over *sequences of action strings*;
* cut iff d_K < tau (strict), evaluated once every member has K steps or has ended; never evaluated if
  every member ended before step K (the reference's loop exits first).

Deviations, on purpose: a list of checkpoints K may be given (each evaluated once, in order, until one
cuts); the decision is also made when the gate lags and some member has already ended after K, since the
rollout stage ignores a cut for a group that is no longer running.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
from rapidfuzz.distance import Levenshtein

from pipeline.contracts import GateDecision as GateDecision  # re-exported: the contract lives in pipeline/
from pipeline.messages import RolloutFailed, StepEvent
from pipeline.outcomes import zero_variance_label

from .base import Checkpoint, Threshold

END = "<END>"


_PAD = chr(0x100)  # the code point of <END>


def _prefix_codes(actions_per_rollout: Sequence[Sequence[str]], k: int) -> list[str]:
    """Each rollout's padded K-prefix as a string of one code point per action: the same Levenshtein
    distances as over the lists of action strings, at about half the cost."""
    codes: dict[str, str] = {END: _PAD}
    out = []
    for actions in actions_per_rollout:
        chars = []
        for action in actions[:k]:
            code = codes.get(action)
            if code is None:
                code = codes[action] = chr(0x100 + len(codes))
            chars.append(code)
        out.append("".join(chars).ljust(k, _PAD))
    return out


def mean_prefix_edit_distance(actions_per_rollout: Sequence[Sequence[str]], k: int) -> float:
    """d_K: mean pairwise Levenshtein distance of the `<END>`-padded K-prefixes, divided by K.

    Args:
        actions_per_rollout: G lists of action strings (any lengths; only the first k are used).
        k: prefix length K >= 1.

    Returns:
        A float in [0, 1]; 0.0 for G < 2 (no pairs).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if len(actions_per_rollout) < 2:
        return 0.0
    return coded_prefix_distance(_prefix_codes(actions_per_rollout, k), k)


def action_code(codes: dict[str, str], action: str) -> str:
    """The one code point standing for `action` in a group's table `codes` (added when new), never <END>'s:
    a gate that keeps each member's actions as a string of these (`gates.zero_variance_features`) gets
    d_K from `coded_prefix_distance` without re-coding the prefixes at each checkpoint."""
    if action == END:
        return _PAD  # as `_prefix_codes`: an action spelled <END> is the padding
    code = codes.get(action)
    if code is None:
        code = codes[action] = chr(0x101 + len(codes))
    return code


def coded_prefix_distance(codes: Sequence[str], k: int) -> float:
    """d_K of members given as strings of action codes (`action_code`; any lengths, cut and padded to k here).
    Each distinct prefix pair once, weighted by multiplicity (identical prefixes are at distance 0). Written for
    the zero-variance gate's decision budget: one Levenshtein call per distinct pair and nothing else per pair."""
    g = len(codes)
    if g < 2:
        return 0.0
    counts: dict[str, int] = {}  # [unique prefixes] -> multiplicity
    for code in codes:
        prefix = code[:k]
        if len(prefix) < k:
            prefix = prefix.ljust(k, _PAD)
        counts[prefix] = counts.get(prefix, 0) + 1
    distance, items, total = Levenshtein.distance, list(counts.items()), 0
    for i, (a, na) in enumerate(items):
        for b, nb in items[i + 1:]:
            total += na * nb * distance(a, b)
    return total / (g * (g - 1) // 2 * k)


def decide(actions_per_rollout: Sequence[Sequence[str]], k: int, tau: float) -> GateDecision:
    """The pure cut rule at checkpoint k: cut iff d_K < tau. Fewer than two rollouts have no pairs to
    compare: that is no decision, never a cut."""
    if len(actions_per_rollout) < 2:
        return GateDecision(cut=False, value=float("nan"), checkpoint=k, reason="fewer than 2 rollouts: no decision")
    d = mean_prefix_edit_distance(actions_per_rollout, k)
    cut = d < tau
    relation = "<" if cut else ">="
    return GateDecision(cut=cut, value=d, checkpoint=k, reason=f"prefix edit distance d_{k}={d:.3f} {relation} tau={tau}")


@dataclass(slots=True)
class _GroupState:
    actions: list[list[str]]
    ended: list[bool]
    pending: list[int]
    """Checkpoints not evaluated yet, ascending."""
    ready: int = 0
    """Members with at least pending[0] actions or ended (kept incrementally: O(1) per step)."""
    decisions: list[GateDecision] = field(default_factory=list)

    def recount(self) -> None:
        k = self.pending[0] if self.pending else 0
        self.ready = sum(len(a) >= k or done for a, done in zip(self.actions, self.ended, strict=True))


class PrefixEditDistanceGate:
    """Watches each group's step stream and decides, at each checkpoint K, whether to cut the group.

    Feed it `open(group_id, size)`, every `StepEvent` through `observe`, and `close(group_id)`; it returns
    a `GateDecision` from `observe` whenever a checkpoint is evaluated.
    """

    name = "prefix_edit_distance"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        k: Checkpoint = 12
        """The checkpoint K: the prefix length compared."""
        tau: Threshold = 0.5
        """Cut iff d_K < tau. The reference's 0.12 (a 7B model) never fires with the tiny default policy,
        whose prefixes are far more diverse; K=12, tau=0.5 saves most at precision >= 0.8 on this workload
        (docs/gate.md, bench/calibrate_gate.py). The stall gate (configs/stall.toml) saves far more."""
        checkpoints: list[Checkpoint] = []
        """Extra checkpoints K (besides `k`) at which the gate is evaluated; empty = only `k`."""

    def __init__(self, options: Options = Options()) -> None:  # noqa: B008 (a frozen Struct)
        self.options = options
        self.tau = options.tau
        self.checkpoints = sorted({options.k, *options.checkpoints})
        self._groups: dict[int, _GroupState] = {}

    def open(self, group_id: int, size: int) -> None:
        self._groups[group_id] = _GroupState(
            actions=[[] for _ in range(size)], ended=[False] * size, pending=list(self.checkpoints)
        )

    def close(self, group_id: int) -> list[GateDecision]:
        state = self._groups.pop(group_id, None)
        return state.decisions if state else []

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    def observe(self, event: StepEvent | RolloutFailed) -> GateDecision | None:
        state = self._groups.get(event.group_id)
        if state is None or not state.pending:
            return None  # unknown, closed or fully decided group: nothing to decide
        r = event.rollout_index
        if not 0 <= r < len(state.actions):
            return None  # not a member of this group (the gate stage drops these before they get here)
        actions = state.actions[r]
        was_ready = len(actions) >= state.pending[0] or state.ended[r]
        if isinstance(event, RolloutFailed):
            state.ended[r] = True  # a failed member no longer holds the decision back
        else:
            actions.append(event.action)
            state.ended[r] |= event.done
        if not was_ready and (len(actions) >= state.pending[0] or state.ended[r]):
            state.ready += 1
        if state.ready < len(state.actions):
            return None
        return self._evaluate_ready(state)

    def _evaluate_ready(self, state: _GroupState) -> GateDecision | None:
        """Evaluate every checkpoint that is ready; return the latest decision (None if none)."""
        latest = None
        while state.pending and state.ready == len(state.actions):
            k = state.pending.pop(0)
            if all(state.ended) and max(len(a) for a in state.actions) < k:
                state.pending.clear()  # every member ended before K: never evaluated
                break
            latest = decide(state.actions, k, self.tau)
            state.decisions.append(latest)
            if latest.cut:
                state.pending.clear()
            state.recount()
        return latest


@dataclass
class ShadowLedger:
    """Online precision/recall of cut decisions against each group's real outcome.

    A positive is a zero-variance group (every complete rollout got the same reward). Only groups that ran
    to completion have a real outcome, so in shadow mode (nothing is cut) every group counts; the gate
    stage labels a prompt by its merged group and leaves failed rollouts out. A group with fewer than two
    complete rewards is unlabelled (`zero_variance_label`, the offline calibration's rule too): counted
    in `unlabelled`, in neither precision nor recall.
    """

    true_positive: int = 0
    false_positive: int = 0
    false_negative: int = 0
    true_negative: int = 0
    unlabelled: int = 0

    def record(self, would_cut: bool, rewards: Sequence[float]) -> None:
        """rewards: the group's complete rollouts' rewards."""
        zero_variance = zero_variance_label(rewards)
        if zero_variance is None:
            self.unlabelled += 1
        elif would_cut and zero_variance:
            self.true_positive += 1
        elif would_cut:
            self.false_positive += 1
        elif zero_variance:
            self.false_negative += 1
        else:
            self.true_negative += 1

    @property
    def groups(self) -> int:
        return self.true_positive + self.false_positive + self.false_negative + self.true_negative

    def precision(self) -> float | None:
        flagged = self.true_positive + self.false_positive
        return self.true_positive / flagged if flagged else None

    def recall(self) -> float | None:
        positives = self.true_positive + self.false_negative
        return self.true_positive / positives if positives else None

    def as_dict(self) -> Mapping[str, float | None]:
        return {
            "gate/shadow_groups": self.groups,
            "gate/shadow_tp": self.true_positive,
            "gate/shadow_fp": self.false_positive,
            "gate/shadow_fn": self.false_negative,
            "gate/shadow_unlabelled": self.unlabelled,
            "gate/precision": self.precision(),
            "gate/recall": self.recall(),
        }
