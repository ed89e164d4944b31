"""Uniform allocation: plain GRPO. Every prompt gets G rollouts, prompts drawn in reshuffled epochs.

Every complete group trains (zero-variance ones too: dropping them is the learner's `drop_zero_variance` or
the `dapo` allocator's job); cut groups never do. All of it is `AllocatorBase`'s default but the draw.
"""

from __future__ import annotations

import msgspec

from .base import Admission, AllocatorBase


class UniformAllocator(AllocatorBase):
    name = "uniform"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        pass

    def next_admission(self, free_slots: int) -> Admission | None:
        if not self.fits(self.ctx.group_size, free_slots):
            return None
        return Admission(task_id=self.next_task(), size=self.ctx.group_size)

    def on_skipped(self, admission: Admission) -> None:
        """An admission screen skipped the prompt (`pipeline.allocation.SkippingAllocator`): counted only."""
        self.ledger.skipped()
