"""Uniform allocation: plain GRPO. Every prompt gets G rollouts, prompts drawn in reshuffled epochs.

Every complete group trains (zero-variance ones too: dropping them is the learner's `drop_zero_variance` or
the `dapo` allocator's job); cut groups never do.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import msgspec

from pipeline.messages import GroupResult

from ._common import Ledger, TaskCycle, require_fit, rng_state, set_rng_state, trainable
from .base import Admission, AllocatorContext


class UniformAllocator:
    name = "uniform"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        pass

    def __init__(self, options: Options, ctx: AllocatorContext) -> None:
        if not ctx.tasks:
            raise ValueError("uniform allocator: no tasks to admit")
        self._ctx = ctx
        self._rng = random.Random(ctx.seed)
        self._cycle = TaskCycle([t.task_id for t in ctx.tasks], self._rng)
        self._ledger = Ledger()

    def next_admission(self, free_slots: int) -> Admission | None:
        if not require_fit(self._ctx.group_size, free_slots, self._ledger.in_flight, "uniform allocator"):
            return None
        return Admission(task_id=self._cycle.next(), size=self._ctx.group_size)

    def on_admitted(self, group_id: int, admission: Admission) -> None:
        self._ledger.admitted(admission.size, new_prompt=True)

    def on_skipped(self, admission: Admission) -> None:
        """An admission screen skipped the prompt (`pipeline.allocation.SkippingAllocator`): counted only."""
        self._ledger.skipped()

    def on_result(self, result: GroupResult) -> list[GroupResult]:
        self._ledger.finished(result)
        if not trainable(result):
            self._ledger.dropped()
            return []
        return [self._ledger.trained(result)]

    def on_update(self, version: int) -> None:
        pass

    def statistics(self) -> Mapping[str, float]:
        return {**self._ledger.statistics(), "allocator/epoch": float(self._cycle.epoch)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": rng_state(self._rng),
            "cycle": self._cycle.state_dict(),
            "ledger": self._ledger.state_dict(pending_kept=0),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        set_rng_state(self._rng, state["rng"])
        self._cycle.load_state_dict(state["cycle"])
        self._ledger.load_state_dict(state["ledger"])
