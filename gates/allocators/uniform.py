"""Uniform allocation: plain GRPO. Every prompt gets G rollouts, prompts drawn in reshuffled epochs."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import msgspec

from pipeline.messages import GroupResult

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
        self._order: list[str] = []
        self._epoch = 0
        self._admitted = 0
        self._rollouts = 0
        self._emitted = 0

    def _next_task(self) -> str:
        if not self._order:
            self._order = [t.task_id for t in self._ctx.tasks]
            self._rng.shuffle(self._order)
            self._epoch += 1
        return self._order.pop()

    def next_admission(self, free_slots: int) -> Admission | None:
        if free_slots < self._ctx.group_size:
            return None
        return Admission(task_id=self._next_task(), size=self._ctx.group_size)

    def on_admitted(self, group_id: int, admission: Admission) -> None:
        self._admitted += 1
        self._rollouts += admission.size

    def on_result(self, result: GroupResult) -> list[GroupResult]:
        if result.cut:
            return []
        self._emitted += 1
        return [result]

    def on_update(self, version: int) -> None:
        pass

    def statistics(self) -> Mapping[str, float]:
        return {
            "allocator/groups_admitted": self._admitted,
            "allocator/rollouts_spent": self._rollouts,
            "allocator/groups_emitted": self._emitted,
            "allocator/prompts_skipped": 0,
            "allocator/epoch": self._epoch,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self._rng.getstate(), "order": list(self._order), "epoch": self._epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._rng.setstate(_as_rng_state(state["rng"]))
        self._order = list(state["order"])
        self._epoch = int(state["epoch"])


def _as_rng_state(state: Any) -> tuple[Any, ...]:
    """random.Random state survives a JSON round trip as nested lists; setstate wants tuples."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
