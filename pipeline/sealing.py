"""Frames from strangers: what a run's sockets seal every point-to-point frame with (`pipeline.transport`).

`open_context(secret=...)` (the run's per-run secret, `new_secret()`) seals every frame of its point-to-point
sockets (push, pull, pair, dealer, router): each message goes out as two frames, a keyed BLAKE2b tag of the
payload under the secret (`frame_tag`), then the payload. A receiving socket drops a message that `unseal`
refuses (its tag missing or wrong) as `bad_token` before decoding it, so only the run's own processes (which
got the secret when they were started) can send a frame that any stage reads. The secret itself never travels
and is never logged. The events PUB/SUB stream is not sealed: nothing the run reads comes from it, and
observers in other processes read it without the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

SECRET_BYTES = 32
TAG_BYTES = 16
"""A frame's tag: keyed BLAKE2b of its payload (16 bytes: a forger's chance per frame is 2^-128)."""
SEALED_KINDS = frozenset({"push", "pull", "pair", "dealer", "router"})
"""The sockets a secret seals: everything but the events stream's PUB / SUB."""


def new_secret() -> bytes:
    """A fresh per-run secret (random; hand it to stage processes privately, never on a command line)."""
    return secrets.token_bytes(SECRET_BYTES)


def frame_tag(secret: bytes, payload: bytes | memoryview) -> bytes:
    """The tag a sealed socket sends before `payload` (and checks on receipt)."""
    return hashlib.blake2b(payload, key=secret, digest_size=TAG_BYTES).digest()


def unseal(secret: bytes, message: list[bytes]) -> bytes | None:
    """The payload of a sealed message: two frames, the first the second's tag under `secret`; None otherwise."""
    if len(message) != 2 or not hmac.compare_digest(message[0], frame_tag(secret, message[1])):
        return None
    return message[1]
