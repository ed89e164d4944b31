"""Family weighting: slots go to task families by how often their groups teach something.

History-based skipping (GRESO) needs prompts that recur; in a run that sees each prompt once it skips
nothing. What does recur is the family (`Task.family`): a family whose groups keep coming back all-fail or
all-succeed (zero variance, no gradient) is one whose next prompt is likely to waste its G rollouts too.
This allocator keeps, per family, decayed counts of finished groups and of the *mixed* ones among them,
and draws the next prompt's family with probability

    weight_f ∝ share_f · max(rate_f, floor)^power,   rate_f = (mixed_f + prior) / (groups_f + 2·prior)

(`family_weights`; share_f is the family's fraction of the train tasks, so equal rates give uniform
sampling over tasks), then the prompt from that family's own reshuffled cycle. Counts decay by `decay` per
learner update, so a family the policy has learned (all-succeed) or starts to solve (mixed again) moves
with it; `floor` keeps every family sampled so its rate stays measured. Cut groups say nothing about
variance and are not counted. Every complete group trains, as with `uniform` (the learner's
`drop_zero_variance` drops the zero-variance ones).

rollcut's own rule, not a paper's: a family-level cousin of GRESO's per-prompt skipping and of VIP's
success prediction from `Task.family`, without a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import msgspec

from pipeline.messages import GroupResult

from ._common import is_zero_variance, rewards_of, trainable
from .base import Admission, AllocatorBase, AllocatorContext, TaskCycle


def family_weights(
    shares: Sequence[float], groups: Sequence[float], mixed: Sequence[float], *, prior: float, floor: float, power: float
) -> list[float]:
    """Sampling probabilities [F] of F families from their task shares [F] and decayed group counts [F]."""
    raw = [
        share * max((m + prior) / (g + 2 * prior), floor) ** power
        for share, g, m in zip(shares, groups, mixed, strict=True)
    ]
    total = sum(raw)
    return [w / total for w in raw]


class FamilyAllocator(AllocatorBase):
    name = "family"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        prior: Annotated[float, msgspec.Meta(gt=0)] = 1.0
        """Beta pseudo-counts on each side of a family's mixed rate (a new family starts at 0.5)."""
        decay: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.95
        """Counts are multiplied by this after each learner update (1 = remember every group equally)."""
        floor: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.1
        """No family's rate counts below this: each keeps being sampled, so its rate stays measured."""
        power: Annotated[float, msgspec.Meta(ge=0)] = 1.0
        """How sharply the rate steers (0 = uniform over tasks)."""

    def __init__(self, options: Options, ctx: AllocatorContext) -> None:
        super().__init__(options, ctx, cycle=False)  # a cycle per family instead
        self._options = options
        by_family: dict[str, list[str]] = {}
        for task in ctx.tasks:
            by_family.setdefault(task.family, []).append(task.task_id)
        self._families = sorted(by_family)
        self._family_of = {task.task_id: task.family for task in ctx.tasks}
        self._cycles = {f: TaskCycle(by_family[f], self.rng) for f in self._families}
        self._shares = [len(by_family[f]) / len(ctx.tasks) for f in self._families]
        self._groups = dict.fromkeys(self._families, 0.0)
        self._mixed = dict.fromkeys(self._families, 0.0)
        self._admitted = dict.fromkeys(self._families, 0)

    def weights(self) -> dict[str, float]:
        """The probability that the next prompt comes from each family."""
        o = self._options
        probs = family_weights(self._shares, [self._groups[f] for f in self._families], [self._mixed[f] for f in self._families],
                               prior=o.prior, floor=o.floor, power=o.power)
        return dict(zip(self._families, probs, strict=True))

    def next_admission(self, free_slots: int) -> Admission | None:
        if not self.fits(self.ctx.group_size, free_slots):
            return None
        weights = self.weights()
        family = self.rng.choices(self._families, weights=[weights[f] for f in self._families])[0]
        return Admission(task_id=self._cycles[family].next(), size=self.ctx.group_size)

    def on_admitted(self, group_id: int, admission: Admission) -> None:
        super().on_admitted(group_id, admission)
        self._admitted[self._family_of[admission.task_id]] += 1

    def on_skipped(self, admission: Admission) -> None:
        """An admission screen skipped the prompt (`pipeline.allocation.SkippingAllocator`): counted only."""
        self.ledger.skipped()

    def decide(self, result: GroupResult, admission: Admission) -> list[GroupResult]:
        if not trainable(result):
            return self.drop()
        family = self._family_of.get(result.task_id)
        if family is not None:
            self._groups[family] += 1
            self._mixed[family] += float(not is_zero_variance(rewards_of(result)))
        return [self.train(result)]

    def on_update(self, version: int) -> None:
        for family in self._families:
            self._groups[family] *= self._options.decay
            self._mixed[family] *= self._options.decay

    def extra_statistics(self) -> Mapping[str, float]:
        admitted = max(sum(self._admitted.values()), 1)
        stats: dict[str, float] = {}
        for family, weight in self.weights().items():
            stats[f"allocator/weight/{family}"] = weight
            stats[f"allocator/admitted_share/{family}"] = self._admitted[family] / admitted
        return stats

    def extra_state(self) -> dict[str, Any]:
        return {
            "cycles": {f: c.state_dict() for f, c in self._cycles.items()},
            "groups": dict(self._groups),
            "mixed": dict(self._mixed),
            "admitted": dict(self._admitted),
        }

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        for family, cycle in state["cycles"].items():
            self._cycles[family].load_state_dict(cycle)
        self._groups = {f: float(state["groups"][f]) for f in self._families}
        self._mixed = {f: float(state["mixed"][f]) for f in self._families}
        self._admitted = {f: int(state["admitted"][f]) for f in self._families}
