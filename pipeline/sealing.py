"""Frames from strangers: what a run's sockets seal every point-to-point frame with (`pipeline.transport`).

`open_context(secret=...)` (the run's per-run secret, `new_secret()`) seals every frame of its point-to-point
sockets (push, pull, pair, dealer, router): each message goes out as three frames, a keyed BLAKE2b tag, a header
(the sending socket's random id and its counter: 1, 2, 3...), then the payload. The tag covers the stream (what
both ends call the socket's address, `stream_of`), the header and the payload. A receiving socket drops a message
that `Unsealer.unseal` refuses before decoding it: `bad_token` when its tag is missing or wrong (a stranger's
frame, or one sealed for another stream), `replayed` when its sender's counter does not go up (a sealed frame
recorded on the path and sent again). So only the run's own processes (which got the secret when they were
started) can send a frame that any stage reads, each only once, only on its stream. The secret itself never
travels and is never logged. The events PUB/SUB stream is not sealed: nothing the run reads comes from it, and
observers in other processes read it without the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct

SECRET_BYTES = 32
TAG_BYTES = 16
"""A frame's tag: keyed BLAKE2b (16 bytes: a forger's chance per frame is 2^-128)."""
HEADER = struct.Struct(">8sQ")
"""A sealed frame's header: the sending socket's random id (8 bytes), its counter (unsigned 64-bit, from 1)."""
SEALED_KINDS = frozenset({"push", "pull", "pair", "dealer", "router"})
"""The sockets a secret seals: everything but the events stream's PUB / SUB."""


def new_secret() -> bytes:
    """A fresh per-run secret (random; hand it to stage processes privately, never on a command line)."""
    return secrets.token_bytes(SECRET_BYTES)


def stream_of(address: str) -> bytes:
    """What both ends of a stream call it: an ipc / inproc path, or a tcp port (the host differs: bound on one
    side as `0.0.0.0`, reached on the other by a name or an IP)."""
    scheme, _, rest = address.partition("://")
    return f"tcp:{rest.rsplit(':', 1)[-1]}".encode() if scheme == "tcp" else address.encode()


def frame_tag(secret: bytes, stream: bytes, header: bytes, payload: bytes | memoryview) -> bytes:
    """The tag a sealed socket sends before `header` and `payload` on `stream` (and checks on receipt)."""
    h = hashlib.blake2b(key=secret, digest_size=TAG_BYTES)
    h.update(len(stream).to_bytes(2, "big"))
    h.update(stream)
    h.update(header)
    h.update(payload)
    return h.digest()


class Sealer:
    """A sending socket's seal: its own random id and a counter that goes up with every message."""

    def __init__(self, secret: bytes, stream: bytes) -> None:
        self._secret, self._stream = secret, stream
        self._sender = secrets.token_bytes(8)
        self._counter = 0

    def seal(self, payload: bytes | memoryview) -> list[bytes | memoryview]:
        self._counter += 1
        header = HEADER.pack(self._sender, self._counter)
        return [frame_tag(self._secret, self._stream, header, payload), header, payload]


class Unsealer:
    """A receiving socket's check: the tag under the secret for this stream, and each sender's counter going up
    (the highest seen per sender id: only holders of the secret can add ids)."""

    def __init__(self, secret: bytes, stream: bytes) -> None:
        self._secret, self._stream = secret, stream
        self._last: dict[bytes, int] = {}

    def unseal(self, message: list[bytes]) -> tuple[bytes | None, str]:
        """(payload, "") for a sealed message seen for the first time; (None, reason) otherwise: `bad_token` (not
        three frames, a header of the wrong size, a tag that is not this payload's on this stream) or `replayed`."""
        if len(message) != 3 or len(message[1]) != HEADER.size:
            return None, "bad_token"
        tag, header, payload = message
        if not hmac.compare_digest(tag, frame_tag(self._secret, self._stream, header, payload)):
            return None, "bad_token"
        sender, counter = HEADER.unpack(header)
        if counter <= self._last.get(sender, 0):
            return None, "replayed"
        self._last[sender] = counter
        return payload, ""
