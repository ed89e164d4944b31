"""ZeroMQ sockets under Trio: with pipeline/curve.py (its security), the only module in rollcut that imports zmq.

The ZMQ_FD a socket exposes is *edge-triggered* and signals the socket's internal mailbox, not data. So
every operation here is non-blocking (`NOBLOCK`), checks `zmq.EVENTS` before waiting, and after waking
re-checks (wake-ups may be spurious). Only one task may wait on a socket's FD at a time; other waiters
park and re-check whenever it wakes, and because our own send can consume the edge a receiver waits for
(and vice versa), every successful send/recv kicks the waiters to re-check EVENTS. Each socket has one
owner (zmq sockets are not thread-safe): keep it in the Trio thread.

Lifetimes: `open_context()` terminates the context (`ctx.term()`) on exit, after every socket is closed
with its linger, so queued messages are flushed instead of silently lost at exit. One case linger does not
cover (libzmq#4660, open): frames still in flight when the sending process exits while the receiver's queue
is at its high-water mark are lost. Where a tail matters, the receiver has to confirm it before the sending
process exits.

Frames are msgspec msgpack; each `Socket` owns one encoder and one typed decoder for its union. A frame
that fails to decode is dropped and counted by reason (`empty`, `undecodable`, `wrong_shape`); a stage that
finds a decoded message invalid (unknown group, index out of range...) drops it with `Socket.drop(reason)`.
`Context.dropped_frames()` gives every receiving socket's counts (the run's summary.json). Warnings are
rate-limited: the first `WARN_FIRST` drops of a socket are logged one by one, then one line with the
counts every `WARN_EVERY` drops, so a flood of garbage cannot flood the log.

Frame sizes: every socket refuses an incoming frame larger than its role carries (`ZMQ_MAXMSGSIZE`, checked
by libzmq from the frame's header, before it allocates anything): `MESSAGE_FRAME_BYTES` for every message but
weights, `weights_frame_bytes(...)` for the two sockets that carry weights (a decoding worker's inbox, the
reports of a learner process), sized from the model. libzmq drops the sender's connection instead of the frame
and does not say why, so such a frame is never decoded, never held in memory, and not in `dropped_frames`
(it cannot be told from a peer that left).

Frames from other hosts: a tcp socket binds where its address says; `pipeline.config` refuses a tcp bind
address that is not loopback unless `transport.allow_remote` is set or CURVE keys are configured. With
`open_context(curve_dir=...)` every tcp socket uses ZeroMQ CURVE (pipeline/curve.py): only peers whose public
key is listed get through, and each refused handshake is counted on the binding socket's `dropped_frames`
(`unauthenticated`, `handshake_failed`). See docs/architecture.md, "Transport security".

Frames from strangers: `open_context(secret=...)` (the run's per-run secret) seals every frame of its
point-to-point sockets (pipeline/sealing.py), bound to its stream and its sender's counter; a receiving socket
drops a message whose tag is missing or wrong as `bad_token`, and one whose sender's counter does not go up
as `replayed`, before decoding it. `socket(secret=...)` seals one socket with another secret (a custom stage's
reports: least privilege, pipeline/run/child_reports.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec
import structlog
import trio
import zmq

from . import curve
from .sealing import SEALED_KINDS, Sealer, Unsealer, stream_of

log = structlog.get_logger(__name__)

T = TypeVar("T")
SocketKind = Literal["push", "pull", "pub", "sub", "pair", "dealer", "router"]
_KINDS = {
    "push": zmq.PUSH,
    "pull": zmq.PULL,
    "pub": zmq.PUB,
    "sub": zmq.SUB,
    "pair": zmq.PAIR,
    "dealer": zmq.DEALER,
    "router": zmq.ROUTER,
}
DEFAULT_LINGER_MS = 5_000
"""How long close() keeps unsent messages before ctx.term() may drop them."""
MESSAGE_FRAME_BYTES = 64 << 20
"""The largest frame a socket takes unless its role carries weights: a step, a cut, a group's trajectories with
their token ids, log-probs and nuclei (a few MB for the largest groups), a request or a reply."""
WARN_FIRST = 10
"""Dropped frames of one socket logged one by one; after that, one summary line every WARN_EVERY drops."""
WARN_EVERY = 1_000


def weights_frame_bytes(tensor_bytes: int, copies: int) -> int:
    """The largest frame of a socket whose messages carry `copies` copies of a model of `tensor_bytes` bytes
    (the packed form adds a few bytes per tensor), beside what any message may carry."""
    return copies * tensor_bytes + MESSAGE_FRAME_BYTES


@dataclass(frozen=True, slots=True)
class SocketStatistics:
    sent: int
    received: int
    dropped_frames: int
    """Frames dropped: failed to decode, or refused by the owning stage (counted, logged, dropped)."""
    dropped_by_reason: dict[str, int]


class Context:
    """A zmq context whose lifetime is a Trio `async with` block (see `open_context`)."""

    def __init__(self, ctx: zmq.Context[Any], keys: curve.CurveKeys | None = None, nursery: trio.Nursery | None = None,
                 *, secret: bytes = b"") -> None:
        self._ctx = ctx
        self._sockets: list[Socket[Any]] = []
        self._keys = keys
        self._secret = secret  # seals the point-to-point sockets (never logged: no repr shows it)
        self._remote: dict[str, dict[str, dict[str, int]]] = {}
        """The last dropped-frame counts each stage process reported (`record_remote_drops`)."""
        self._nursery = nursery  # runs the refusal monitors of CURVE server sockets
        assert keys is None or nursery is not None, "CURVE needs a nursery for its monitors"
        self._servers: dict[str, bytes] = {}
        """Connect address -> the CURVE public key of the peer that bound it (`trust_server`)."""

    def trust_server(self, address: str, public: bytes) -> None:
        """A connect to `address` expects the server key `public` (a peer with a key pair of its own, such as
        a Ray actor's bound socket) instead of this context's server key."""
        self._servers[address] = public

    def dropped_frames(self) -> dict[str, dict[str, int]]:
        """Dropped frames by reason of every receiving socket (and refused peers of every CURVE server
        socket) opened so far, by socket name, with what stage processes reported of theirs."""
        out: dict[str, dict[str, int]] = {}
        for sock in self._sockets:
            if sock.receives is not None or sock.statistics().dropped_frames:
                _add(out.setdefault(sock.name, {}), sock.statistics().dropped_by_reason)
        for remote in self._remote.values():
            for name, reasons in remote.items():
                _add(out.setdefault(name, {}), reasons)
        return out

    def record_remote_drops(self, origin: str, counts: Mapping[str, Mapping[str, int]]) -> None:
        """The dropped-frame counts (so far) of the sockets of stage process `origin`; replaces its last ones."""
        self._remote[origin] = {name: dict(reasons) for name, reasons in counts.items()}

    def close_all(self) -> None:
        """Close every socket still open (each with its linger); term() needs them all closed."""
        for sock in self._sockets:
            sock.close()

    def socket(
        self,
        kind: SocketKind,
        address: str,
        *,
        bind: bool,
        receives: Any = None,
        hwm: int = 10_000,
        subscribe: bytes = b"",
        linger_ms: int = DEFAULT_LINGER_MS,
        name: str | None = None,
        secret: bytes | None = None,
        max_frame: int = MESSAGE_FRAME_BYTES,
    ) -> Socket[Any]:
        """Create and bind/connect a socket.

        Args:
            kind: zmq socket type by name.
            address: inproc://name, ipc:///path or tcp://host:port (port 0 with bind picks a free port;
                read it back from `Socket.address`).
            bind: bind (True) or connect (False).
            receives: the type (usually a union of message Structs) frames decode to; None for send-only.
            hwm: send and receive high-water marks (bounded queues).
            subscribe: SUB prefix filter (b"" = everything).
            name: what the socket is called in logs and `dropped_frames()` (default: its address).
            secret: seal this socket with this secret instead of the context's (b"": not at all).
            max_frame: the largest frame it takes, in bytes (see the module doc, "Frame sizes").
        """
        if kind not in _KINDS:
            raise ValueError(f"unknown socket kind {kind!r} (known: {', '.join(_KINDS)})")
        raw = self._ctx.socket(_KINDS[kind])
        raw.setsockopt(zmq.SNDHWM, hwm)
        raw.setsockopt(zmq.RCVHWM, hwm)
        raw.setsockopt(zmq.LINGER, linger_ms)
        raw.setsockopt(zmq.MAXMSGSIZE, max_frame)
        if kind == "sub":
            raw.setsockopt(zmq.SUBSCRIBE, subscribe)
        monitor = None
        if self._keys is not None and address.startswith("tcp://"):
            curve.secure(raw, self._keys, server=bind, server_key=self._servers.get(address))
            monitor = curve.monitor_refusals(raw) if bind else None
        try:
            if bind:
                if address.startswith("tcp://") and address.endswith(":0"):
                    port = raw.bind_to_random_port(address[: -len(":0")])
                    address = f"{address[: -len(':0')]}:{port}"
                else:
                    raw.bind(address)
            else:
                raw.connect(address)
        except zmq.ZMQError as exc:
            if monitor is not None:
                monitor.close(linger=0)
            raw.close(linger=0)
            raise OSError(f"cannot {'bind' if bind else 'connect'} {kind} socket to {address}: {exc}") from exc
        secret = (self._secret if secret is None else secret) if kind in SEALED_KINDS else b""
        sock: Socket[Any] = Socket(raw, address, receives, name=name, secret=secret)
        self._sockets.append(sock)
        if monitor is not None:
            assert self._nursery is not None
            self._nursery.start_soon(curve.count_refusals, raw, monitor, sock.drop)
        return sock


def _add(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for reason, n in counts.items():
        into[reason] = into.get(reason, 0) + n


@contextlib.asynccontextmanager
async def open_context(curve_dir: str = "", *, secret: bytes = b"", keys: curve.CurveKeys | None = None) -> AsyncIterator[Context]:
    """A fresh zmq context, terminated on exit (after sockets close, so their linger is honoured).

    With `secret` (`new_secret()`) its point-to-point sockets send sealed messages and drop unsealed or
    wrongly sealed ones as `bad_token` (see the module doc); without it they send and accept bare frames.

    `ctx.term()` blocks until every socket is closed and flushed; it runs in a worker thread so the Trio
    loop stays responsive while messages drain. With `curve_dir` (a folder `curve_problems` accepts), or
    `keys` made in memory (`curve.own_keys`), tcp sockets use CURVE; the ZAP handler and the refusal monitors run in this block's own nursery, which is
    cancelled when the block ends, before the sockets close.
    """
    ctx: zmq.Context[Any] = zmq.Context()
    wrapper = Context(ctx, secret=secret)
    try:
        if not curve_dir and keys is None:
            yield wrapper
            return
        keys = keys or curve.load_keys(curve_dir)
        async with trio.open_nursery() as nursery:  # a failure in the body comes out in an ExceptionGroup
            await nursery.start(curve.serve_zap, ctx, keys.authorized)
            wrapper = Context(ctx, keys, nursery, secret=secret)
            yield wrapper
            nursery.cancel_scope.cancel()
    finally:
        wrapper.close_all()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(ctx.term)


class Socket(Generic[T]):
    """One zmq socket driven from Trio. One owner task for sending, one for receiving (may be the same)."""

    def __init__(self, raw: zmq.Socket[Any], address: str, receives: Any, *, name: str | None = None,
                 secret: bytes = b"") -> None:
        self._raw = raw
        self._secret = secret
        self._sealer = Sealer(secret, stream_of(address)) if secret else None
        self._unsealer = Unsealer(secret, stream_of(address)) if secret else None
        self.address = address
        self.name = name or address
        self.receives = receives
        self._fd = raw.getsockopt(zmq.FD)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(receives) if receives is not None else None
        self._fd_waiter: trio.CancelScope | None = None  # the one task waiting on the FD, if any
        self._parked = trio.lowlevel.ParkingLot()  # everyone else waiting for readiness
        self._closed = False
        self._sent = 0
        self._received = 0
        self._dropped: dict[str, int] = {}
        self._dropped_total = 0

    # -- readiness ----------------------------------------------------------------------------------

    async def _wait(self, flag: int) -> None:
        """Return once EVENTS shows `flag`; checks before waiting (the FD is edge-triggered).

        One task waits on the FD; others park and re-check whenever it wakes, since any edge may be
        the one they need (the FD only ever turns readable, for POLLIN and POLLOUT alike).
        """
        while not self._raw.getsockopt(zmq.EVENTS) & flag:
            if self._fd_waiter is not None:
                await self._parked.park()
                continue
            with trio.CancelScope() as scope:
                self._fd_waiter = scope
                try:
                    await trio.lowlevel.wait_readable(self._fd)
                finally:
                    self._fd_waiter = None
                    self._parked.unpark_all()

    def _kick(self) -> None:
        """Our own send/recv may have consumed the edge another task waits for: make it re-check."""
        if self._fd_waiter is not None:
            self._fd_waiter.cancel()
        self._parked.unpark_all()

    # -- sending ------------------------------------------------------------------------------------

    async def send(self, message: Any) -> None:
        """Encode and send one message, waiting while the high-water mark is reached."""
        await self.send_bytes(self._encoder.encode(message))

    async def send_bytes(self, frame: bytes) -> None:
        """Send one frame as it is (sealed, with its tag and header, when the socket has a secret)."""
        sealed = self._sealer.seal(frame) if self._sealer is not None else None
        while True:
            try:
                if sealed is not None:
                    self._raw.send_multipart(sealed, zmq.NOBLOCK, copy=False)
                else:
                    self._raw.send(frame, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                await self._wait(zmq.POLLOUT)
                continue
            self._sent += 1
            self._kick()
            await trio.lowlevel.checkpoint()
            return

    # -- receiving ----------------------------------------------------------------------------------

    def drop(self, reason: str, detail: str = "") -> None:
        """Count one dropped frame under `reason`; log it (rate-limited, see WARN_FIRST / WARN_EVERY)."""
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
        self._dropped_total += 1
        n = self._dropped_total
        if n <= WARN_FIRST:
            log.warning("transport.bad_frame", socket=self.name, reason=reason, detail=detail[:200],
                        note="further drops are summarised" if n == WARN_FIRST else None)
        elif n % WARN_EVERY == 0:
            log.warning("transport.bad_frames", socket=self.name, dropped=n, by_reason=dict(self._dropped))

    def _decode(self, message: list[bytes]) -> Any:
        assert self._decoder is not None, "this socket was opened without a message type"
        frame = self._unseal(message)
        if frame is None:
            return _DROPPED
        try:
            return self._decoder.decode(frame)
        except msgspec.ValidationError as exc:
            self.drop("wrong_shape", f"{len(frame)} bytes: {exc}")
        except msgspec.DecodeError as exc:
            self.drop("empty" if not frame else "undecodable", f"{len(frame)} bytes: {exc}")
        return _DROPPED

    def _unseal(self, message: list[bytes]) -> bytes | None:
        """The payload of a message; None (dropped) when the socket is sealed and the message is not sealed
        for this stream under the secret (`bad_token`) or was seen before (`replayed`)."""
        if self._unsealer is None:
            return message[0]
        payload, reason = self._unsealer.unseal(message)
        if payload is None:
            self.drop(reason, f"{len(message)} frame(s), {sum(map(len, message))} bytes")
        return payload

    def _recv_nowait(self) -> list[bytes] | None:
        """One message: its frames when sealed (checked by `_unseal`), else one frame."""
        try:
            message = self._raw.recv_multipart(zmq.NOBLOCK) if self._secret else [self._raw.recv(zmq.NOBLOCK)]
        except zmq.Again:
            return None
        self._received += 1
        self._kick()
        return message

    async def receive(self) -> T:
        """The next message that decodes (bad frames are counted and skipped)."""
        while True:
            received = self._recv_nowait()
            if received is None:
                await self._wait(zmq.POLLIN)
                continue
            message = self._decode(received)
            if message is not _DROPPED:
                await trio.lowlevel.checkpoint()
                return message

    async def receive_many(self, max_messages: int = 1024) -> list[T]:
        """Wait for at least one frame, then drain up to `max_messages` without yielding in between."""
        out: list[T] = []
        while not out:
            first = self._recv_nowait()
            if first is None:
                await self._wait(zmq.POLLIN)
                continue
            for received in self._drain(first, max_messages):
                message = self._decode(received)
                if message is not _DROPPED:
                    out.append(message)
        await trio.lowlevel.checkpoint()
        return out

    def _drain(self, first: list[bytes], max_messages: int) -> Iterator[list[bytes]]:
        yield first
        for _ in range(max_messages - 1):
            received = self._recv_nowait()
            if received is None:
                return
            yield received

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        while True:
            for message in await self.receive_many():
                yield message

    # -- lifetime -----------------------------------------------------------------------------------

    def statistics(self) -> SocketStatistics:
        return SocketStatistics(
            sent=self._sent, received=self._received, dropped_frames=self._dropped_total, dropped_by_reason=dict(self._dropped)
        )

    def close(self) -> None:
        """Close with the socket's linger; the context's term() then flushes what is still queued."""
        if self._closed:
            return
        self._closed = True
        trio.lowlevel.notify_closing(self._fd)
        self._raw.close()

    async def __aenter__(self) -> Socket[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


_DROPPED: Any = object()
