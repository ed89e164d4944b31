"""Allocators for the CLI checks: one whose constructor refuses the configured task list."""

from __future__ import annotations

import msgspec

from gates.allocators import Admission, AllocatorBase, AllocatorContext


class NeedsManyTasks(AllocatorBase):
    """Refuses to be built with fewer than `least` train tasks (a check only building finds)."""

    name = "needs_many"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        least: int = 100_000

    def __init__(self, options: Options, ctx: AllocatorContext) -> None:
        super().__init__(options, ctx)
        if len(ctx.tasks) < options.least:
            raise RuntimeError(f"needs at least {options.least} train tasks, got {len(ctx.tasks)}")

    def next_admission(self, free_slots: int) -> Admission | None:
        return Admission(self.next_task(), self.ctx.group_size) if self.fits(self.ctx.group_size, free_slots) else None
