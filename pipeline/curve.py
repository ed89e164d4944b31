"""ZeroMQ CURVE for tcp sockets: key files, a ZAP handler that admits listed public keys, refusals counted.

A keys folder (`python run.py keys DIR`, or `make_keys`) holds ZeroMQ certificate files:

    server.key, server.key_secret   the binding side's key pair (every tcp socket rollcut binds)
    client.key, client.key_secret   the connecting side's key pair (every tcp socket rollcut connects)
    authorized/*.key                 public keys a binding socket admits (make_keys puts client.key there)

With `transport.curve_dir` set, every tcp socket of the run's zmq context uses CURVE: binders set
`CURVE_SERVER` and the server secret key, connectors the server's public key and their own key pair, and
the traffic is encrypted. A ZAP handler (pyzmq's `zmq.auth.Authenticator`, driven by a Trio task instead of
its thread or asyncio wrappers; its `handle_zap_message` is a plain coroutine) admits a client only if its
public key is in `authorized/`. A peer on another host that runs stages needs the folder's client key pair
and server public key (`server.key`), never the server's secret. `make_keys` writes the folder 0700 and
its files 0600; a secret key file that its group or others may read or write is refused when the keys
are loaded (`curve_problems`: a configuration error). inproc and ipc sockets are untouched
(in-process, or guarded by file permissions).

Key pairs made in memory (`own_keys`): where no folder is shared (on a Ray cluster, `pipeline/run/ray_launch.py`)
each process makes its own pair, its secret key never leaving it, and is told the public keys it admits and
the public key of the one server it connects to; `serve_zap` then admits that set instead of a folder.

Refused handshakes are counted on the refusing socket through a socket monitor: `unauthenticated` (a
CURVE client whose key is not listed: ZAP said no) and `handshake_failed` (no CURVE, or the wrong server
key). They count connection attempts, whose frames never arrive, next to the socket's dropped frames.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import trio
import zmq
import zmq.auth
from zmq.utils.monitor import parse_monitor_message

log = structlog.get_logger(__name__)

AUTHORIZED = "authorized"
ZAP_DOMAIN = "rollcut"
"""The ZAP domain of every CURVE server socket (refusals are told apart per socket by its monitor)."""
REFUSALS = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "unauthenticated",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "handshake_failed",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "handshake_failed",
}


@dataclass(frozen=True, slots=True)
class CurveKeys:
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    authorized: Path | frozenset[bytes]
    """Folder of admitted client public keys (*.key certificate files), or the admitted public keys (z85)."""


def new_key_pair() -> tuple[bytes, bytes]:
    """A fresh CURVE key pair (z85 public, z85 secret), for the process that will use it (`own_keys`)."""
    return zmq.curve_keypair()


def own_keys(public: bytes, secret: bytes, *, admits: frozenset[bytes] = frozenset(), server: bytes = b"") -> CurveKeys:
    """A process's own key pair (`zmq.curve_keypair()`, made in that process) as both its server and client
    pair: its binds admit `admits` (z85 public keys), its connects expect the server key `server`."""
    return CurveKeys(server or public, secret, public, secret, admits)


def make_keys(directory: str | Path) -> list[Path]:
    """Write a server and a client key pair and authorize the client; refuses to overwrite keys.

    The folder is 0700 and every file 0600 from the moment it exists: they are written under umask 077
    (a secret key is never readable by others, even between its write and a chmod)."""
    folder = Path(directory)
    existing = [p for p in (folder / "server.key_secret", folder / "client.key_secret") if p.exists()]
    if existing:
        raise FileExistsError(f"{folder} already holds keys ({', '.join(p.name for p in existing)}); pick an empty folder")
    umask = os.umask(0o077)  # the process's, for these few writes (a CLI command: no other thread writes now)
    try:
        (folder / AUTHORIZED).mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)  # also a folder that existed before
        written = []
        for name in ("server", "client"):
            public, secret = zmq.auth.create_certificates(folder, name)
            written += [Path(public), Path(secret)]
        written.append(Path(shutil.copy(folder / "client.key", folder / AUTHORIZED / "client.key")))
    finally:
        os.umask(umask)
    return written


def _load(path: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise ValueError(f"{path} does not exist (make a keys folder with `python run.py keys DIR`)")
    mode = path.stat().st_mode & 0o777
    if secret and mode & 0o077:
        raise ValueError(f"{path} holds a secret key but is readable or writable by others (mode {mode:04o}); "
                         f"run `chmod 600 {path}` (or make new keys with `python run.py keys DIR`)")
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a ZeroMQ certificate: {exc}") from exc
    if secret and secret_key is None:
        raise ValueError(f"{path} holds no secret key")
    return public, secret_key


def curve_problems(directory: str) -> list[str]:
    """Everything wrong with a keys folder, as config messages (empty when it is usable or not set)."""
    if not directory:
        return []
    where = f"transport.curve_dir = {directory!r}"
    if not zmq.has("curve"):
        return [f"{where}: this libzmq was built without CURVE (zmq.has('curve') is False)"]
    folder = Path(directory)
    if not folder.is_dir():
        return [f"{where}: no such folder (make one with `python run.py keys {directory}`)"]
    problems = []
    for name in ("server.key_secret", "client.key_secret"):
        try:
            _load(folder / name, secret=True)
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
    authorized = folder / AUTHORIZED
    try:
        if not zmq.auth.load_certificates(authorized):
            problems.append(f"{where}: {authorized} lists no public key (*.key): no client could connect")
    except (OSError, ValueError) as exc:
        problems.append(f"{where}: {authorized}: {exc}")
    return problems


def load_keys(directory: str) -> CurveKeys:
    """The key pairs of a folder that `curve_problems` accepted."""
    folder = Path(directory)
    server_public, server_secret = _load(folder / "server.key_secret", secret=True)
    client_public, client_secret = _load(folder / "client.key_secret", secret=True)
    assert server_secret is not None and client_secret is not None
    return CurveKeys(server_public, server_secret, client_public, client_secret, folder / AUTHORIZED)


def secure(raw: zmq.Socket[Any], keys: CurveKeys, *, server: bool, server_key: bytes | None = None) -> None:
    """Set a socket's CURVE options before it binds (server) or connects (client: to `server_key`, by
    default the keys' server key)."""
    if server:
        raw.curve_server = True
        raw.curve_secretkey = keys.server_secret
        raw.zap_domain = ZAP_DOMAIN.encode()
    else:
        raw.curve_serverkey = server_key or keys.server_public
        raw.curve_publickey = keys.client_public
        raw.curve_secretkey = keys.client_secret


async def _ready(raw: zmq.Socket[Any]) -> None:
    """Wait until a socket this task alone reads has a message (its FD is edge-triggered: check first)."""
    fd = raw.getsockopt(zmq.FD)
    while not raw.getsockopt(zmq.EVENTS) & zmq.POLLIN:
        await trio.lowlevel.wait_readable(fd)


class _Admitted:
    """pyzmq's credentials provider for a set of public keys held in memory."""

    def __init__(self, keys: frozenset[bytes]) -> None:
        self._keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        return domain == ZAP_DOMAIN and key in self._keys


async def serve_zap(ctx: zmq.Context[Any], authorized: Path | frozenset[bytes], *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Answer the context's ZAP requests until cancelled: CURVE clients whose public key is listed (in the
    folder, or in the set) pass."""
    auth = zmq.auth.Authenticator(ctx, log=None)
    auth.start()  # binds its REP socket at inproc://zeromq.zap.01, where libzmq sends the context's requests
    try:
        if isinstance(authorized, frozenset):
            auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=_Admitted(authorized))
        else:
            auth.configure_curve(domain=ZAP_DOMAIN, location=str(authorized))
        task_status.started()
        while True:
            await _ready(auth.zap_socket)
            await auth.handle_zap_message(auth.zap_socket.recv_multipart(zmq.NOBLOCK))
    finally:
        trio.lowlevel.notify_closing(auth.zap_socket.getsockopt(zmq.FD))
        auth.stop()


def monitor_refusals(raw: zmq.Socket[Any]) -> zmq.Socket[Any]:
    """A monitor socket of a CURVE server socket's failed handshakes (made before it binds: none is missed)."""
    return raw.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                  | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


async def count_refusals(raw: zmq.Socket[Any], monitor: zmq.Socket[Any], drop: Callable[[str, str], None]) -> None:
    """Read `monitor` (see `monitor_refusals`) until cancelled; `drop(reason, detail)` counts each refusal."""
    try:
        while True:
            await _ready(monitor)
            event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            reason = REFUSALS.get(event["event"])
            if reason is not None:
                drop(reason, f"peer handshake refused (zmq event {event['event']}, value {event['value']})")
    finally:
        trio.lowlevel.notify_closing(monitor.getsockopt(zmq.FD))
        if not raw.closed:
            raw.disable_monitor()
        monitor.close(linger=0)
