"""The gate stage: receives the step stream over ZMQ, keeps per-group prefixes, sends `CancelGroup`.

Any registered gate (`gates.GATES`, or `module:Class`) can be plugged in by `gate.name`. In shadow mode
the stage sends the decision flagged `shadow=True` (nothing is cancelled) and, when the group closes,
scores it against the group's real reward variance for online precision/recall.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from gates import GATES, ShadowLedger
from pipeline.messages import CancelGroup, GroupClosed, GroupOpened, RolloutFailed, StepEvent, StepStream
from pipeline.stage import StageContext

from .step_validation import StepValidator


class GateStage:
    name = "gate"

    def __init__(
        self,
        *,
        gate: str = "prefix_edit_distance",
        k: int = 10,
        tau: float = 0.12,
        checkpoints: Sequence[int] = (),
        shadow: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.gate = GATES.get(gate)(k=k, tau=tau, checkpoints=checkpoints, **(options or {}))
        self.shadow = shadow
        self.ledger = ShadowLedger()
        self._would_cut: set[int] = set()
        self.decisions = 0
        self.cuts = 0
        self.decision_seconds = 0.0
        self.decision_cpu_seconds = 0.0
        self.groups_seen = 0
        self.validator = StepValidator()

    def statistics(self) -> dict[str, float | None]:
        per_decision = self.decision_seconds / self.decisions * 1e6 if self.decisions else None
        cpu_per_decision = self.decision_cpu_seconds / self.decisions * 1e6 if self.decisions else None
        stats: dict[str, float | None] = {
            "gate/groups_seen": self.groups_seen,
            "gate/decisions": self.decisions,
            "gate/cut_decisions": self.cuts,
            "gate/us_per_decision": per_decision,
            "gate/cpu_us_per_decision": cpu_per_decision,
            "gate/open_groups": self.gate.open_groups if hasattr(self.gate, "open_groups") else None,
        }
        if self.shadow:
            stats |= self.ledger.as_dict()
        return stats

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        steps = ctx.zmq.socket("pull", ctx.addresses.steps, bind=True, receives=StepStream, hwm=ctx.addresses.hwm, name="steps")
        control = ctx.zmq.socket("push", ctx.addresses.control, bind=False, hwm=ctx.addresses.hwm)
        async with steps, control:
            task_status.started()
            async for message in steps:
                if not self._valid(message, steps):
                    continue
                decision = self._handle(message, ctx)
                if decision is not None:
                    await control.send(decision)

    def _valid(self, message: StepStream, steps: Any) -> bool:
        """Drop (and count on the socket) what contradicts the groups seen so far (see step_validation)."""
        reason = self.validator.check(message)
        if reason is None:
            return True
        steps.drop(reason, f"{type(message).__name__} group {getattr(message, 'group_id', '?')}")
        if reason == "duplicate_group":
            self.gate.close(message.group_id)  # two senders disagree: never decide on this group
            self._would_cut.discard(message.group_id)
        return False

    def _handle(self, message: StepStream, ctx: StageContext) -> CancelGroup | None:
        match message:
            case GroupOpened(group_id=gid, size=size):
                self.groups_seen += 1
                self.gate.open(gid, size)
            case StepEvent() | RolloutFailed():
                with ctx.profiler.span("gate", "decide"):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    decision = self.gate.observe(message)
                    if decision is not None:
                        # Wall time includes waiting for the GIL behind the policy and learner threads;
                        # thread CPU time is what the decision itself costs.
                        self.decision_seconds += time.perf_counter() - t0
                        self.decision_cpu_seconds += time.thread_time() - c0
                        self.decisions += 1
                ctx.profiler.items("gate", 1)
                if decision is not None and decision.cut:
                    self.cuts += 1
                    self._would_cut.add(message.group_id)
                    return CancelGroup(
                        group_id=message.group_id,
                        reason=decision.reason,
                        gate=self.gate.name,
                        value=decision.value,
                        shadow=self.shadow,
                    )
            case GroupClosed(group_id=gid, rewards=rewards, cut=cut):
                self.gate.close(gid)
                would_cut = gid in self._would_cut
                self._would_cut.discard(gid)
                if self.shadow and not cut:
                    self.ledger.record(would_cut, rewards)
        return None
