"""The gate stage: receives the step stream over ZMQ, keeps per-group prefixes, sends `CancelGroup`.

Any registered gate (`gates.GATES`, or `module:Class`) can be plugged in by `gate.name`. In shadow mode
the stage sends the decision flagged `shadow=True` (nothing is cancelled) and, when the group closes,
scores it against the group's real reward variance for online precision/recall.

Only a prompt's first-stage group (admission kind group / pilot / explore) of size >= 2 is gated: a
Pilot-Commit commit group or an AERO rescue chunk extends a prompt the allocator already chose to spend
more on, and a single rollout has no pairs to compare. Shadow labels are the zero variance of the
prompt's *merged* group (first stage + later stages, complete trajectories only: a failed or cut
rollout's partial reward is no label); a merged group with fewer than two complete rewards is unlabelled
(`pipeline.outcomes.zero_variance_label`, the offline calibration's rule).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import trio

from gates import ShadowLedger
from gates.base import Gate, LearningGate, ResumableLearningGate
from pipeline.messages import CancelGroup, GroupClosed, GroupOpened, RolloutFailed, StepEvent, StepStream
from pipeline.outcomes import FIRST_STAGE_KINDS, MergedOutcomes, is_gated
from pipeline.stage import StageContext

from .rollout import GateIdentity
from .step_validation import StepValidator


@dataclass(frozen=True)
class GateStatistics(Mapping[str, float | None]):
    """The gate stage's figures at one moment (frozen); read as a mapping it is the flat `gate/...` metrics."""

    groups_seen: int
    decisions: int
    cut_decisions: int
    us_per_decision: float | None
    """Wall time per decision (includes waiting for the GIL behind the policy and learner threads)."""
    cpu_us_per_decision: float | None
    open_groups: int | None
    groups_gated: int
    groups_seen_by_kind: Mapping[str, int]
    decisions_by_kind: Mapping[str, int]
    shadow: Mapping[str, float | None]
    """Online precision/recall (`ShadowLedger.as_dict()`), in shadow mode."""
    learned: Mapping[str, float | None] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """A learning gate's own figures (`LearningGate.report`: live precision / recall per checkpoint...)."""

    def _flat(self) -> dict[str, float | None]:
        flat: dict[str, float | None] = {
            "gate/groups_seen": self.groups_seen,
            "gate/decisions": self.decisions,
            "gate/cut_decisions": self.cut_decisions,
            "gate/us_per_decision": self.us_per_decision,
            "gate/cpu_us_per_decision": self.cpu_us_per_decision,
            "gate/open_groups": self.open_groups,
            "gate/groups_gated": self.groups_gated,
        }
        flat |= {f"gate/groups_seen/{kind}": n for kind, n in self.groups_seen_by_kind.items()}
        flat |= {f"gate/decisions/{kind}": n for kind, n in self.decisions_by_kind.items()}
        return flat | dict(self.shadow) | dict(self.learned)

    def __getitem__(self, key: str) -> float | None:
        return self._flat()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._flat())

    def __len__(self) -> int:
        return len(self._flat())


@dataclass(slots=True)
class _Root:
    """What the gate stage remembers of a prompt until its label settles."""

    group_id: int
    would_cut: bool = False


class GateStage:
    name = "gate"

    def __init__(self, gate: Gate, *, shadow: bool = False) -> None:
        """`gate`: a built gate (`gates.build_gate`; the run builds it in `pipeline/run/build.py`); `shadow`:
        send decisions flagged shadow (nothing is cancelled) and score them."""
        self.gate = gate
        self.learning = gate if isinstance(gate, LearningGate) else None
        """The gate, when it learns from the stream (labels, refits in `serve`)."""
        self.shadow = shadow
        self.ledger = ShadowLedger()
        self._would_cut: set[int] = set()
        self._gated: set[int] = set()
        self._labels = MergedOutcomes(on_settled=self._score, window=64)
        self.groups_by_kind: dict[str, int] = {}
        self.decisions_by_kind: dict[str, int] = {}
        self.decisions = 0
        self.cuts = 0
        self.decision_seconds = 0.0
        self.decision_cpu_seconds = 0.0
        self.groups_seen = 0
        self._gated_closed = 0
        self._kinds: dict[int, str] = {}
        self.validator = StepValidator()

    def identity(self) -> GateIdentity:
        """Whose cut decisions the rollout stage accepts: this gate's."""
        return GateIdentity(self.gate.name, self.shadow)

    def statistics(self) -> GateStatistics:
        per_decision = self.decision_seconds / self.decisions * 1e6 if self.decisions else None
        cpu_per_decision = self.decision_cpu_seconds / self.decisions * 1e6 if self.decisions else None
        return GateStatistics(
            groups_seen=self.groups_seen, decisions=self.decisions, cut_decisions=self.cuts,
            us_per_decision=per_decision, cpu_us_per_decision=cpu_per_decision,
            open_groups=self.gate.open_groups if hasattr(self.gate, "open_groups") else None,
            groups_gated=len(self._gated) + self._gated_closed,
            groups_seen_by_kind=MappingProxyType(dict(sorted(self.groups_by_kind.items()))),
            decisions_by_kind=MappingProxyType(dict(sorted(self.decisions_by_kind.items()))),
            shadow=MappingProxyType(self.ledger.as_dict() if self.shadow else {}),
            learned=MappingProxyType(dict(self.learning.report()) if self.learning is not None else {}),
        )

    _COUNTERS = ("decisions", "cuts", "decision_seconds", "decision_cpu_seconds", "groups_seen", "groups_by_kind",
                 "decisions_by_kind", "_gated_closed")

    def counters_state(self) -> dict[str, Any]:
        """The counters a checkpoint keeps (plain data)."""
        ledger = {f.name: getattr(self.ledger, f.name) for f in dataclasses.fields(self.ledger)
                  if isinstance(getattr(self.ledger, f.name), int | float)}
        learned = {"learning": self.learning.state_dict()} if isinstance(self.learning, ResumableLearningGate) else {}
        return {k: getattr(self, k) for k in self._COUNTERS} | {"ledger": ledger} | learned

    def load_counters(self, state: Mapping[str, Any]) -> None:
        """A resumed run's counters, and what a resumable learning gate had learned (`ResumableLearningGate`)."""
        for key in self._COUNTERS:
            setattr(self, key, state[key])
        for key, value in state["ledger"].items():
            setattr(self.ledger, key, value)
        if "learning" in state and isinstance(self.learning, ResumableLearningGate):
            self.learning.load_state_dict(state["learning"])

    def finish(self) -> None:
        """Settle every pending shadow label (call once the step stream has ended)."""
        self._labels.flush()

    def _score(self, rewards: list[float], root: object) -> None:
        assert isinstance(root, _Root)
        if self.shadow:  # fewer than two complete rewards: unlabelled (the ledger counts it)
            self.ledger.record(root.would_cut, rewards)
        if self.learning is not None:  # a cut group never gets here (`MergedOutcomes.discard`)
            self.learning.labelled(root.group_id, rewards)

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        steps = ctx.zmq.socket("pull", ctx.addresses.steps, bind=True, receives=StepStream, hwm=ctx.addresses.hwm, name="steps")
        control = ctx.zmq.socket("push", ctx.addresses.control, bind=False, hwm=ctx.addresses.hwm)
        async with steps, control, trio.open_nursery() as background:
            if self.learning is not None:
                background.start_soon(self.learning.serve)  # refits, in worker threads
            task_status.started(steps.address)  # where the rollout stage sends (the real port of a tcp :0)
            async for message in steps:
                if not self._valid(message, steps):
                    continue
                decision = self._handle(message, ctx)
                if decision is not None:
                    await control.send(decision)
            background.cancel_scope.cancel()

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
            case GroupOpened(group_id=gid, size=size, kind=kind, parent=parent):
                self.groups_seen += 1
                self.groups_by_kind[kind] = self.groups_by_kind.get(kind, 0) + 1
                if kind in FIRST_STAGE_KINDS:
                    self._labels.open_root(gid, kind, _Root(gid))
                else:
                    self._labels.open_child(gid, parent)
                if is_gated(kind, size):
                    self._gated.add(gid)
                    self._kinds[gid] = kind
                    if self.learning is not None:
                        self.learning.opened(message)
                    self.gate.open(gid, size)
            case StepEvent() | RolloutFailed() if message.group_id in self._gated:
                return self._observe(message, ctx)
            case GroupClosed(group_id=gid, rewards=rewards, cut=cut, complete=complete):
                if gid in self._gated:
                    self._gated.discard(gid)
                    self._kinds.pop(gid, None)
                    self._gated_closed += 1
                    self.gate.close(gid)
                if gid in self._would_cut:
                    self._would_cut.discard(gid)
                    self._labels.set_data(gid, _Root(gid, would_cut=True))
                if cut:
                    self._labels.discard(gid)
                else:
                    self._labels.add(gid, [r for r, ok in zip(rewards, complete or [True] * len(rewards), strict=True) if ok])
        return None

    def _observe(self, message: StepEvent | RolloutFailed, ctx: StageContext) -> CancelGroup | None:
        with ctx.profiler.span("gate", "decide"):
            t0, c0 = time.perf_counter(), time.thread_time()
            decision = self.gate.observe(message)
            if decision is not None:
                # Wall time includes waiting for the GIL behind the policy and learner threads;
                # thread CPU time is what the decision itself costs.
                self.decision_seconds += time.perf_counter() - t0
                self.decision_cpu_seconds += time.thread_time() - c0
                self.decisions += 1
                kind = self._kinds.get(message.group_id, "group")
                self.decisions_by_kind[kind] = self.decisions_by_kind.get(kind, 0) + 1
        ctx.profiler.items("gate", 1)
        if decision is None or not decision.cut:
            return None
        self.cuts += 1
        self._would_cut.add(message.group_id)
        return CancelGroup(
            group_id=message.group_id,
            reason=decision.reason,
            gate=self.gate.name,
            value=decision.value,
            shadow=self.shadow,
            checkpoint=decision.checkpoint,
        )
