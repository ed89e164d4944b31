"""A fuzzing observer stage, loaded by `module:Class`. While the run goes on it

* sends `frames` bad frames to each bound socket of the pipeline (steps, control, results) as a peer that
  holds the run's secret would (through the run's own zmq context, so they pass the seal and reach every
  later check): random bytes, empty and 1 MB frames, msgpack of the wrong shape, and schema-valid messages
  that no consistent sender could send (unknown or negative group ids, rollout indices out of range, steps
  out of order, cuts from another gate). Every one is invalid by construction, whatever the timing;
* forges, as a stranger (a zmq context of its own, without the secret), messages that a consistent sender
  could send: for the `rounds` results it reads on the event stream, for each of the next `WINDOW` group
  ids (the groups the run is starting or running), a cut with the run's gate name and shadow flag, steps
  of rollout 0 in order, an announcement (`GroupExpected`) followed by a training group, and with
  `forge_reports` (processes mode) a gate's `StageReady`, the learner's next `LearnerUpdated` carrying a
  pickle that would create the file `touch`, and drop counts. Every one must be dropped as `bad_token`;

then waits until every frame it sent is counted as dropped (by the run's sockets, or reported by its stage
processes) and the learner has published its first update, and sets `plugin_faults.STOPS[key]` so the test
stops the run. Forged steps carry the action `FORGED`, which `ForgedActionGate` cuts on: a forged step (or
a forged cut) that got through would show up as a cut.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import torch
import trio

from gates import GateDecision
from pipeline import tensors
from pipeline.messages import (
    CancelGroup,
    FramesDropped,
    GroupClosed,
    GroupExpected,
    GroupOpened,
    GroupResult,
    LearnerUpdated,
    RolloutFailed,
    StageReady,
    StepEvent,
    Trajectory,
    TrajectoryStatus,
    Turn,
    WeightsPublished,
)
from pipeline.stage import StageContext
from pipeline.transport import open_context
from tests.plugin_faults import STOPS

FORGED = "FORGED"
HUGE = 10**12
WINDOW = 4
"""Group ids forged per round: the next ones after the latest result (ids ascend; a few groups run at once)."""
COUNT_WAIT_S = 300
"""How long the fuzzer waits for its frames to be counted. Counting 30,000 frames takes seconds; a frame that
got through is never counted, and the run then stops here instead of at its wall limit."""


class ForgedActionGate:
    """Cuts a group as soon as it observes the action FORGED (real actions never are)."""

    name = "forged_probe"

    def __init__(self) -> None:  # no `Options`: it takes none
        self.forged_seen = 0

    def open(self, group_id: int, size: int) -> None:
        pass

    def observe(self, event: StepEvent | RolloutFailed) -> GateDecision | None:
        if isinstance(event, StepEvent) and event.action == FORGED:
            self.forged_seen += 1
            return GateDecision(cut=True, value=0.0, checkpoint=1, reason="forged step accepted")
        return None

    def close(self, group_id: int) -> list[GateDecision]:
        return []


def _garbage(rng: random.Random) -> list[Callable[[], bytes]]:
    enc = msgspec.msgpack.encode
    return [
        lambda: rng.randbytes(rng.randint(1, 300)),
        lambda: b"",
        lambda: enc({"type": "StepEvent", "group_id": "zero"}),
        lambda: enc([1, 2, {"a": None}]),
        lambda: enc(rng.randint(-HUGE, HUGE)),
        lambda: enc({"type": "NoSuchMessage", "x": 1}),
    ]


def _step(rng: random.Random, **kw: Any) -> bytes:
    fields = {"group_id": rng.randint(0, 60), "rollout_index": 0, "step_index": 0, "action": FORGED, "done": False,
              "reward": 1.0, "policy_version": 0} | kw
    return msgspec.msgpack.encode(StepEvent(**fields))


def _steps_frames(rng: random.Random) -> list[Callable[[], bytes]]:
    enc = msgspec.msgpack.encode
    return _garbage(rng) + [
        lambda: _step(rng, group_id=rng.choice([HUGE + rng.randint(0, 9), -1 - rng.randint(0, 9)])),
        lambda: _step(rng, rollout_index=rng.choice([99, -1, 4096])),
        lambda: _step(rng, step_index=rng.choice([-1, -7, 10**6])),
        lambda: _step(rng, step_index=10**6, done=True),
        lambda: enc(RolloutFailed(group_id=HUGE, rollout_index=0, error="forged")),
        lambda: enc(RolloutFailed(group_id=rng.randint(0, 60), rollout_index=-1, error="forged")),
        lambda: enc(GroupOpened(group_id=-5, task_id="x", size=4, policy_version=0, admitted_at=0.0)),
        lambda: enc(GroupOpened(group_id=HUGE, task_id="x", size=rng.choice([0, -3, 10**6]), policy_version=0, admitted_at=0.0)),
        lambda: enc(GroupClosed(group_id=HUGE + 1, rewards=[1.0], cut=False, steps=1)),
        lambda: enc(CancelGroup(group_id=0, reason="wrong stream", gate="forged_probe", value=0.0)),
    ]


def _control_frames(rng: random.Random) -> list[Callable[[], bytes]]:
    enc = msgspec.msgpack.encode
    return _garbage(rng) + [
        lambda: enc(CancelGroup(group_id=rng.choice([-1, HUGE]), reason="forged", gate="forged_probe", value=0.0)),
        lambda: enc(CancelGroup(group_id=rng.randint(0, 60), reason="forged", gate="someone_else", value=0.0)),
        lambda: enc(CancelGroup(group_id=rng.randint(0, 60), reason="forged", gate="forged_probe", value=0.0, shadow=True)),
        lambda: _step(rng),
    ]


def _group(group_id: int, *, turns_ok: bool = True) -> GroupResult:
    """A training group of 4 rollouts with mixed rewards (well formed when `turns_ok`)."""
    turn = Turn(prompt_ids=[1, 2], token_ids=[3], logprobs=[-0.1] if turns_ok else [], action=FORGED, policy_version=0)
    trajectories = [Trajectory(rollout_index=i, turns=[turn], reward=float(i % 2), success=bool(i % 2),
                               status=TrajectoryStatus.COMPLETE) for i in range(4)]
    return GroupResult(group_id=group_id, task_id="forged", trajectories=trajectories, cut=False)


def _result(rng: random.Random, group_id: int, *, turns_ok: bool = True) -> bytes:
    return msgspec.msgpack.encode(_group(group_id, turns_ok=turns_ok))


def _results_frames(rng: random.Random) -> list[Callable[[], bytes]]:
    return _garbage(rng) + [
        lambda: _result(rng, rng.choice([-1 - rng.randint(0, 9), HUGE + rng.randint(0, 9)])),
        lambda: _result(rng, HUGE, turns_ok=False),
        lambda: _step(rng),
    ]


def frames(kinds: list[Callable[[], bytes]], n: int, rng: random.Random, megabyte_frames: int = 3) -> Iterator[bytes]:
    for _ in range(megabyte_frames):
        yield rng.randbytes(1 << 20)
    for i in range(n - megabyte_frames):
        yield kinds[i % len(kinds)]()


class _TouchesAFile:
    """Unpickling this creates `path`: the payload of a forged learner report."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def _forged(gid: int, *, touch: str, forge_reports: bool, version: int) -> dict[str, list[Any]]:
    """Well-formed messages about live group `gid`, by the socket they go to."""
    out: dict[str, list[Any]] = {
        "control": [CancelGroup(group_id=gid, reason="forged", gate=ForgedActionGate.name, value=0.0, shadow=False)],
        "steps": [StepEvent(group_id=gid, rollout_index=0, step_index=i, action=FORGED, done=False, reward=0.0,
                            policy_version=0) for i in range(8)],
        "results": [GroupExpected(group_id=gid), _group(gid)],
    }
    if forge_reports:
        weights = tensors.pack({"forged": torch.zeros(1)})
        out["reports"] = [
            StageReady(stage="gate", gate="someone_else", shadow=True),
            LearnerUpdated(version=version, stats={}, train_seconds=0.0, groups_trained=2, weights=weights,
                           trainer_state=pickle.dumps(_TouchesAFile(touch))),
            LearnerUpdated(version=version, stats={}, train_seconds=0.0, groups_trained=2,
                           weights=pickle.dumps(_TouchesAFile(touch))),
            FramesDropped(stage="learner", counts={}),
        ]
    return out


class Fuzzer:
    name = "fuzzer"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        key: str
        frames: int = 10_000
        """Bad frames (sealed with the run's secret) to each of steps, control and results; 0: none."""
        rounds: int = 25
        """Rounds of well-formed forgeries from a stranger, one per result read on the event stream."""
        forge_reports: bool = False
        """Also forge reports (`transport.mode = "processes"`: the run reads a reports socket)."""
        touch: str = ""
        """The file a forged report's pickle would create (checked by the test)."""
        seed: int = 0

    def __init__(self, options: Options) -> None:
        self.options = options
        self.sent: dict[str, int] = {}
        """Bad frames sent, by socket."""
        self.forged: dict[str, int] = {}
        """Well-formed forged messages sent by a stranger, by socket."""
        self.targets: list[int] = []
        """The group ids the forgeries named."""
        self.latest = -1
        """The highest group id of a result read on the event stream."""
        self.counted: dict[str, dict[str, int]] = {}
        """The run's dropped frames when every frame sent was counted."""
        self._new_result = trio.Event()
        self._updated = trio.Event()

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        o = self.options
        rng = random.Random(o.seed)
        targets = {"steps": (ctx.addresses.steps, _steps_frames(rng)), "control": (ctx.addresses.control, _control_frames(rng)),
                   "results": (ctx.addresses.results, _results_frames(rng))}
        events = ctx.subscribe()
        async with trio.open_nursery() as watching:
            await watching.start(self._watch, events)
            task_status.started()
            async with trio.open_nursery() as nursery:
                for name, (address, kinds) in targets.items():
                    if o.frames:
                        nursery.start_soon(self._flood, ctx, name, address, kinds, random.Random(rng.random()))
                nursery.start_soon(self._forge, ctx)
            RESULTS[o.key] = self
            with trio.move_on_after(COUNT_WAIT_S):  # only if frames got through uncounted: the test then fails
                await self._wait_counted(ctx)
            await self._updated.wait()  # the first update is in: what the test asserts on
            watching.cancel_scope.cancel()
        STOPS[o.key].set()

    async def _watch(self, events: Any, *, task_status: trio.TaskStatus[None]) -> None:
        async with events:
            task_status.started()
            async for message in events:
                if isinstance(message, GroupResult) and message.group_id > self.latest:
                    self.latest = message.group_id
                    self._new_result.set()
                elif isinstance(message, WeightsPublished):
                    self._updated.set()

    async def _next_result(self) -> int:
        await self._new_result.wait()
        self._new_result = trio.Event()
        return self.latest

    async def _forge(self, ctx: StageContext) -> None:
        """Well-formed messages about live groups, from a zmq context that does not hold the run's secret."""
        o = self.options
        async with open_context() as stranger:
            sockets = {name: stranger.socket("push", getattr(ctx.addresses, name), bind=False, hwm=1000)
                       for name in ("control", "steps", "results", *(("reports",) if o.forge_reports else ()))}
            for _ in range(o.rounds):
                latest = await self._next_result()
                for gid in range(latest + 1, latest + 1 + WINDOW):
                    self.targets.append(gid)
                    forged = _forged(gid, touch=o.touch, forge_reports=o.forge_reports, version=self._version_guess())
                    for name, messages in forged.items():
                        for message in messages:
                            await sockets[name].send(message)
                            self.forged[name] = self.forged.get(name, 0) + 1
            while self.latest < max(self.targets):  # every id named was admitted by the run (ids ascend)
                await self._next_result()
        # leaving the context flushed every forged frame (the sockets' linger)

    def _version_guess(self) -> int:
        """The learner's next version, as a forger would guess it (1 before the first update)."""
        return 2 if self._updated.is_set() else 1

    async def _wait_counted(self, ctx: StageContext) -> None:
        """Until every frame sent is counted as dropped. The counts live in other stages' sockets (and, in
        processes mode, arrive in their periodic reports): no event to wait on."""
        sent = {name: self.sent.get(name, 0) + self.forged.get(name, 0) for name in {*self.sent, *self.forged}}
        while True:
            dropped = ctx.zmq.dropped_frames()
            if all(sum(dropped.get(name, {}).values()) >= n for name, n in sent.items()):
                self.counted = dropped
                return
            await trio.sleep(0.05)

    async def _flood(self, ctx: StageContext, name: str, address: str, kinds: list[Callable[[], bytes]], rng: random.Random) -> None:
        push = ctx.zmq.socket("push", address, bind=False, hwm=1000)
        async with push:
            for frame in frames(kinds, self.options.frames, rng):
                await push.send_bytes(frame)
                self.sent[name] = self.sent.get(name, 0) + 1


RESULTS: dict[str, Fuzzer] = {}
