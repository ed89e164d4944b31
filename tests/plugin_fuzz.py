"""A fuzzing observer stage, loaded by `module:Class`: while the run goes on it sends `frames` bad frames to
each bound socket of the pipeline (steps, control, results), waits until every one of them is counted as
dropped, then sets `plugin_faults.STOPS[key]` so the test stops the run.

Every frame is invalid by construction, whatever the timing: random bytes, empty and 1 MB frames,
msgpack of the wrong shape, and schema-valid messages that no consistent sender could send (unknown or
negative group ids, rollout indices out of range, steps out of order, cuts from another gate). Forged
steps carry the action `FORGED`, which `ForgedActionGate` cuts on: a forged step the gate stage let
through would show up as a cut.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import trio

from gates import GateDecision
from pipeline.messages import (
    CancelGroup,
    GroupClosed,
    GroupOpened,
    GroupResult,
    RolloutFailed,
    StepEvent,
    Trajectory,
    TrajectoryStatus,
    Turn,
)
from pipeline.stage import StageContext
from tests.plugin_faults import STOPS

FORGED = "FORGED"
HUGE = 10**12


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


def _result(rng: random.Random, group_id: int, *, turns_ok: bool = True) -> bytes:
    turn = Turn(prompt_ids=[1, 2], token_ids=[3], logprobs=[-0.1] if turns_ok else [], action=FORGED, policy_version=0)
    trajectories = [Trajectory(rollout_index=i, turns=[turn], reward=float(i % 2), success=bool(i % 2),
                               status=TrajectoryStatus.COMPLETE) for i in range(4)]
    return msgspec.msgpack.encode(GroupResult(group_id=group_id, task_id="forged", trajectories=trajectories, cut=False))


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


class Fuzzer:
    name = "fuzzer"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        key: str
        frames: int = 10_000
        seed: int = 0

    def __init__(self, options: Options) -> None:
        self.key, self.frames, self.seed = options.key, options.frames, options.seed
        self.sent: dict[str, int] = {}

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        rng = random.Random(self.seed)
        targets = {"steps": (ctx.addresses.steps, _steps_frames(rng)), "control": (ctx.addresses.control, _control_frames(rng)),
                   "results": (ctx.addresses.results, _results_frames(rng))}
        task_status.started()
        async with trio.open_nursery() as nursery:
            for name, (address, kinds) in targets.items():
                nursery.start_soon(self._flood, ctx, name, address, kinds, random.Random(rng.random()))
        RESULTS[self.key] = self
        for _ in range(6000):  # wait (at most ~5 min) until every frame sent is counted as dropped
            counted = {name: sum(ctx.zmq.dropped_frames().get(name, {}).values()) for name in targets}
            if all(counted[name] >= self.sent[name] for name in targets):
                break
            await trio.sleep(0.05)
        STOPS[self.key].set()

    async def _flood(self, ctx: StageContext, name: str, address: str, kinds: list[Callable[[], bytes]], rng: random.Random) -> None:
        push = ctx.zmq.socket("push", address, bind=False, hwm=1000)
        async with push:
            for frame in frames(kinds, self.frames, rng):
                await push.send_bytes(frame)
                self.sent[name] = self.sent.get(name, 0) + 1


RESULTS: dict[str, Fuzzer] = {}
