"""The ledger of decoder work by fate: where every env step and generated token of the GRPO phase went.

Each rollout group's work (its env steps, counted by the rollout stage as they happen, and the tokens of its
recorded turns) lands in exactly one fate, decided where the group's end is decided:

    trained_informative    the learner trained on its training group (non-zero reward variance)
    trained_zero_variance  the learner trained on it although it had zero variance (sync-grpo keeps them)
    dropped_all_fail       zero variance, every rollout failed: dropped (by the learner's filter, or the allocator's)
    dropped_all_succeed    zero variance, every rollout won: dropped likewise
    dropped_by_allocator   an allocator dropped a group that had variance (or too few complete rollouts to label)
    cut                    cut by a gate (cuts at admission spend 0 steps); a cut group the learner refused too
    stale                  turns of trained groups the learner left out as stale (`learner.max_staleness`): their
                           steps and tokens move here from the trained fate; `groups` stays 0 (the group is counted
                           as trained)
    unfinished             finished but never trained when the run ended (waiting in the allocator or for the
                           learner), or still running then

A prompt's later groups (a Pilot-Commit commit, an AERO rescue) add to the prompt's first-stage group: their
work shares its fate. A plain `group` is settled by the allocator's answer to it (released for training, or
dropped); an extendable one (pilot, explore) when it is released, when the allocator says it dropped it (its
`allocator/prompts_dropped` count rose while it answered), or when the group lifecycle settles its prompt
without a release (`MergedOutcomes`: no later group came within its window; what a plugin allocator that counts
no drops, or a Pilot-Commit pilot expiring in its queue, relies on).

Pure accounting (no clock, no I/O): the group lifecycle, the update recorder and the summary call it.
`env_steps` summed over the fates equals the rollout stage's `env_steps` (tests/pipeline/test_ledger.py and
tests/test_run_integration.py hold it).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .messages import GroupResult, TrajectoryStatus
from .outcomes import EXTENDABLE_KINDS, is_zero_variance, label_rewards

FATES = (
    "trained_informative", "trained_zero_variance", "dropped_all_fail", "dropped_all_succeed", "dropped_by_allocator",
    "cut", "stale", "unfinished",
)


@dataclass(slots=True)
class Work:
    """Groups, env steps and generated tokens."""

    groups: int = 0
    env_steps: int = 0
    tokens: int = 0

    def add(self, other: Work) -> None:
        self.groups += other.groups
        self.env_steps += other.env_steps
        self.tokens += other.tokens

    def as_dict(self) -> dict[str, int]:
        return {"groups": self.groups, "env_steps": self.env_steps, "tokens": self.tokens}


def group_work(result: GroupResult) -> Work:
    """One rollout group's work: its env steps (`GroupResult.env_steps`) and its recorded turns' tokens."""
    tokens = sum(len(turn.token_ids) for t in result.trajectories for turn in t.turns)
    return Work(1, result.env_steps, tokens)


def outcome_fate(result: GroupResult) -> str:
    """The dropped fate of a finished (uncut) group by its outcome: all failed, all won, or neither."""
    rewards = label_rewards(result)
    if not is_zero_variance(rewards) or len(rewards) < 2:
        return "dropped_by_allocator"
    wins = sum(t.success for t in result.trajectories if t.status == TrajectoryStatus.COMPLETE)
    return "dropped_all_fail" if wins == 0 else "dropped_all_succeed" if wins == len(rewards) else "dropped_by_allocator"


@dataclass(slots=True)
class _Open:
    """A prompt's work not settled yet (its first-stage group id is the key)."""

    work: Work
    extendable: bool
    result: GroupResult | None = None
    """The latest finished group of the prompt (for the dropped fate's outcome)."""


@dataclass(slots=True)
class _Pending:
    """A training group handed to the learner: the work it carries and what the learner will make of it."""

    work: Work
    zero_variance: bool
    dropped_fate: str


@dataclass
class WorkLedger:
    """Work by fate, with the groups whose fate is not decided yet (open prompts, training groups at the learner)."""

    fates: dict[str, Work] = field(default_factory=lambda: {name: Work() for name in FATES})
    cut_at_step: dict[int, int] = field(default_factory=dict)
    """Histogram: the step the cut landed at (the longest running member's env steps) -> cut groups."""
    cut_spent: list[int] = field(default_factory=list)
    """Env steps each cut group had spent (one int per cut: a run cuts at most a few thousand groups)."""
    learner_busy_s: float = 0.0
    """Seconds the learner spent in counted updates."""
    resumed: dict[str, float] = field(default_factory=dict)
    """Idle integrals of the run's earlier segments (`pacer_held_slot_s`, `busy_slot_s`)."""
    _open: dict[int, _Open] = field(default_factory=dict)
    _root_of: dict[int, int] = field(default_factory=dict)
    _pending: dict[int, _Pending] = field(default_factory=dict)

    # -- the group lifecycle

    def group_finished(self, result: GroupResult) -> int:
        """A rollout group returned (complete or cut); returns its prompt's key. A cut decides the fate now."""
        if result.parent is None:
            root = result.group_id
            self._open[root] = _Open(Work(), result.kind in EXTENDABLE_KINDS)
        else:
            root = self._root_of.get(result.parent, result.parent)
            if root not in self._open:  # its prompt was settled already: the allocator's answer to it settles it
                self._open[root] = _Open(Work(), extendable=False)
        self._root_of[result.group_id] = root
        entry = self._open[root]
        entry.work.add(group_work(result))
        entry.result = result
        if result.cut:
            landed = max((len(t.turns) for t in result.trajectories if t.status == TrajectoryStatus.CUT), default=0)
            self.cut_at_step[landed] = self.cut_at_step.get(landed, 0) + 1
            self.cut_spent.append(entry.work.env_steps)
            self._close(root, "cut")
        return root

    def answered(self, root: int, training: Iterable[GroupResult], *, dropped: bool = False) -> None:
        """The allocator's answer to a finished group of prompt `root`: the training groups it released, and
        whether it said it dropped the prompt (its `allocator/prompts_dropped` count rose)."""
        for group in training:
            key = self._root_of.get(group.group_id, group.group_id)
            entry = self._open.pop(key, None)
            if entry is None:
                continue
            self._forget(key)
            rewards = label_rewards(group)
            self._pending[group.group_id] = _Pending(entry.work, is_zero_variance(rewards), outcome_fate(group))
        entry = self._open.get(root)
        if entry is not None and (dropped or not entry.extendable):
            self._close(root, outcome_fate(entry.result) if entry.result is not None else "dropped_by_allocator")

    def prompt_settled(self, root: int) -> None:
        """No later group can extend prompt `root` any more (the lifecycle's `MergedOutcomes` settled it): if the
        allocator has not released an extendable prompt by now, it dropped it. (A plain group is settled by
        `answered`.)"""
        entry = self._open.get(root)
        if entry is not None and entry.extendable:
            self._close(root, outcome_fate(entry.result) if entry.result is not None else "dropped_by_allocator")

    # -- the learner's reports

    def learner_trained(self, group_ids: Iterable[int], *, train_seconds: float, stale: Mapping[str, float]) -> None:
        """An update trained on `group_ids`; `stale` is its report's `learner/items_dropped_stale...` statistics."""
        self.learner_busy_s += train_seconds
        for gid in group_ids:
            pending = self._pending.pop(gid, None)
            if pending is not None:
                self.fates["trained_zero_variance" if pending.zero_variance else "trained_informative"].add(pending.work)
        all_steps, all_tokens = int(stale.get(STALE_ITEMS, 0.0)), int(stale.get(STALE_TOKENS, 0.0))
        zv_steps, zv_tokens = int(stale.get(STALE_ITEMS_ZV, 0.0)), int(stale.get(STALE_TOKENS_ZV, 0.0))
        self._move("trained_informative", all_steps - zv_steps, all_tokens - zv_tokens)
        self._move("trained_zero_variance", zv_steps, zv_tokens)

    def _move(self, fate: str, steps: int, tokens: int) -> None:
        """Stale turns' work out of a trained fate into `stale` (the group stays counted as trained)."""
        self.fates[fate].add(Work(0, -steps, -tokens))
        self.fates["stale"].add(Work(0, steps, tokens))

    def learner_dropped(self, group_id: int, *, cut: bool = False) -> None:
        """The learner dropped training group `group_id` (zero variance, or refused as cut)."""
        pending = self._pending.pop(group_id, None)
        if pending is not None:
            self.fates["cut" if cut else pending.dropped_fate].add(pending.work)

    # -- the end of the run, checkpoints

    def undecided(self) -> Work:
        """The work of every group whose fate is not decided yet (open prompts, groups at the learner)."""
        total = Work()
        for entry in self._open.values():
            total.add(entry.work)
        for pending in self._pending.values():
            total.add(pending.work)
        return total

    def run_ended(self, running: Work) -> None:
        """The phase ended: everything undecided, and the groups still running (`running`), is unfinished."""
        self.fates["unfinished"].add(self.undecided())
        self.fates["unfinished"].add(running)
        self._open.clear()
        self._root_of.clear()
        self._pending.clear()

    def predates(self, env_steps: int) -> None:
        """A run resumed from a checkpoint older than the ledger: its earlier env steps, in a fate of their own."""
        self.fates["before_ledger"] = Work(0, env_steps, 0)

    def state_dict(self, running: Work, *, pacer_held_slot_s: float, busy_slot_s: float) -> dict[str, Any]:
        """The ledger as a resumed run continues it: groups in flight at a checkpoint are lost on resume (new
        groups run in their place), so what is undecided or running now is counted unfinished there."""
        fates = {name: Work(**w.as_dict()) for name, w in self.fates.items()}
        fates["unfinished"].add(self.undecided())
        fates["unfinished"].add(running)
        return {
            "fates": {name: w.as_dict() for name, w in fates.items()},
            "cut_at_step": {str(k): v for k, v in self.cut_at_step.items()},
            "cut_spent": list(self.cut_spent),
            "learner_busy_s": self.learner_busy_s,
            "pacer_held_slot_s": self.resumed.get("pacer_held_slot_s", 0.0) + pacer_held_slot_s,
            "busy_slot_s": self.resumed.get("busy_slot_s", 0.0) + busy_slot_s,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, work in state["fates"].items():
            self.fates[name] = Work(**work)
        self.cut_at_step = {int(k): v for k, v in state["cut_at_step"].items()}
        self.cut_spent = list(state["cut_spent"])
        self.learner_busy_s = state["learner_busy_s"]
        self.resumed = {"pacer_held_slot_s": state["pacer_held_slot_s"], "busy_slot_s": state["busy_slot_s"]}

    def _close(self, root: int, fate: str) -> None:
        entry = self._open.pop(root)
        self._forget(root)
        self.fates[fate].add(entry.work)

    def _forget(self, root: int) -> None:
        for gid in [g for g, r in self._root_of.items() if r == root]:
            del self._root_of[gid]

    # -- the figures

    def figures(self, *, grpo_wall_s: float, slots: int, pacer_held_slot_s: float, busy_slot_s: float) -> dict[str, Any]:
        """summary.json's `ledger` (the schema of docs/outputs.md, "The ledger")."""
        return ledger_figures(
            self.fates, self.cut_at_step, self.cut_spent, grpo_wall_s=grpo_wall_s, slots=slots,
            learner_busy_s=self.learner_busy_s,
            pacer_held_slot_s=self.resumed.get("pacer_held_slot_s", 0.0) + pacer_held_slot_s,
            busy_slot_s=self.resumed.get("busy_slot_s", 0.0) + busy_slot_s,
        )


STALE_ITEMS = "learner/items_dropped_stale"
STALE_TOKENS = "learner/tokens_dropped_stale"
STALE_ITEMS_ZV = "learner/items_dropped_stale_zero_variance"
STALE_TOKENS_ZV = "learner/tokens_dropped_stale_zero_variance"
"""`LearnerReport.stats` keys: turns (one env step each) and tokens the update left out as stale, in all and of
zero-variance groups."""


def ledger_figures(
    fates: Mapping[str, Work], cut_at_step: Mapping[int, int], cut_spent: list[int], *, grpo_wall_s: float, slots: int,
    learner_busy_s: float, pacer_held_slot_s: float, busy_slot_s: float,
) -> dict[str, Any]:
    """The ledger's figures: fates, totals, the cut histogram, the headline and the idle fractions."""
    steps = sum(w.env_steps for w in fates.values())
    tokens = sum(w.tokens for w in fates.values())
    informative = fates["trained_informative"].groups
    wall = grpo_wall_s if grpo_wall_s > 0 else float("nan")
    return {
        "fates": {name: w.as_dict() for name, w in fates.items()},
        "env_steps": steps,
        "tokens": tokens,
        "cut_at_step": {str(k): cut_at_step[k] for k in sorted(cut_at_step)},
        "cut_spent_steps": {
            "mean": statistics.fmean(cut_spent) if cut_spent else None,
            "median": statistics.median(cut_spent) if cut_spent else None,
            "max": max(cut_spent) if cut_spent else None,
        },
        "env_steps_per_informative_group": steps / informative if informative else None,
        "tokens_per_informative_group": tokens / informative if informative else None,
        "idle": {
            "learner_waiting": max(0.0, 1.0 - learner_busy_s / wall),
            "pacer_holding": pacer_held_slot_s / (slots * wall),
            "slot_occupancy": busy_slot_s / (slots * wall),
        },
    }


def ledger_table(ledger: Mapping[str, Any]) -> str:
    """summary.md's table of the ledger: work by fate, then the headline, the cuts and the idle fractions."""
    steps, tokens = ledger["env_steps"], ledger["tokens"]
    lines = ["| fate | groups | env steps | share | tokens | share |", "|---|---|---|---|---|---|"]
    for name, w in ledger["fates"].items():
        lines.append(f"| {name} | {w['groups']} | {w['env_steps']} | {_share(w['env_steps'], steps)} | {w['tokens']} | "
                     f"{_share(w['tokens'], tokens)} |")
    lines.append(f"| total | {sum(w['groups'] for w in ledger['fates'].values())} | {steps} | | {tokens} | |")
    per_steps, per_tokens = ledger["env_steps_per_informative_group"], ledger["tokens_per_informative_group"]
    lines += ["", "Per trained informative group: " + (f"{per_steps:.1f} env steps, {per_tokens:.1f} tokens"
                                                        if per_steps is not None else "none trained")]
    spent = ledger["cut_spent_steps"]
    if ledger["cut_at_step"]:
        landed = ", ".join(f"{k}: {v}" for k, v in ledger["cut_at_step"].items())
        lines.append(f"Cuts landed at step (step: cuts) {landed}; env steps a cut group had spent: mean {spent['mean']:.1f}, "
                     f"median {spent['median']:g}, max {spent['max']}")
    idle = ledger["idle"]
    lines.append("Fractions of the GRPO wall: " + ", ".join(
        f"{label} {_fraction(idle[key])}" for key, label in (
            ("learner_waiting", "learner waiting for a batch"), ("pacer_holding", "free slots held by the pacer"),
            ("slot_occupancy", "slot occupancy"))))
    return "\n".join(lines)


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _fraction(value: float | None) -> str:
    return f"{value:.1%}" if value is not None and value == value else "-"
