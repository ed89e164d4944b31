"""An intruding observer stage for CURVE runs, loaded by `module:Class`: it connects raw zmq sockets with no
CURVE and with a key pair that is not listed to every bound tcp socket of the pipeline, each with a frame
queued, and follows the run through its own (keyed) subscription. Once the learner has published a
version and every bound socket has counted both kinds of refusal, it sets `plugin_faults.STOPS[key]`.
"""

from __future__ import annotations

from typing import Any

import msgspec
import trio
import zmq
import zmq.auth

from pipeline.messages import WeightsPublished
from pipeline.stage import StageContext
from tests.plugin_faults import STOPS

BOUND = {"steps": zmq.PUSH, "control": zmq.PUSH, "results": zmq.PUSH, "events": zmq.SUB}
REASONS = {"handshake_failed", "unauthenticated"}
SEEN: dict[str, dict[str, Any]] = {}


class Intruders:
    name = "intruders"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        key: str
        keys_dir: str
        stranger_dir: str

    def __init__(self, options: Options) -> None:
        self.key = options.key
        self.server_public, _ = zmq.auth.load_certificate(f"{options.keys_dir}/server.key")
        self.stranger = zmq.auth.load_certificate(f"{options.stranger_dir}/client.key_secret")

    def _connect(self, raw_ctx: zmq.Context[Any], address: str, kind: int, *, keyed: bool) -> zmq.Socket[Any]:
        sock = raw_ctx.socket(kind)
        sock.linger = 0
        if keyed:
            sock.curve_publickey, sock.curve_secretkey = self.stranger
            sock.curve_serverkey = self.server_public
        if kind == zmq.SUB:
            sock.subscribe(b"")
        sock.connect(address)
        if kind == zmq.PUSH:
            sock.send(b"\x2a", zmq.NOBLOCK)  # queued until a handshake succeeds, which it never does
        return sock

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        events = ctx.subscribe()  # over tcp with the run's own client keys
        raw_ctx: zmq.Context[Any] = zmq.Context()
        intruders = [self._connect(raw_ctx, getattr(ctx.addresses, name), kind, keyed=keyed)
                     for name, kind in BOUND.items() for keyed in (False, True)]
        updates = 0
        try:
            async with events:
                task_status.started()
                async for message in events:
                    updates += isinstance(message, WeightsPublished)
                    refused = {name: set(counts) & REASONS for name, counts in ctx.zmq.dropped_frames().items()}
                    SEEN[self.key] = {"updates": updates, "refused": refused}
                    if updates >= 1 and sum(len(r) == len(REASONS) for r in refused.values()) >= len(BOUND):
                        STOPS[self.key].set()
                        return
        finally:
            for sock in intruders:
                sock.close()
            raw_ctx.term()
