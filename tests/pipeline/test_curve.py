"""CURVE on tcp sockets: keyed peers get through, unkeyed and unlisted ones are refused and counted."""

import collections
import shutil
import stat

import pytest
import trio
import zmq

from pipeline.config import ConfigError, load_config
from pipeline.curve import curve_problems, make_keys, own_keys
from pipeline.transport import Socket, open_context

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")


def test_make_keys_writes_two_pairs_authorizes_the_client_and_refuses_to_overwrite(tmp_path):
    written = {p.relative_to(tmp_path / "keys").as_posix() for p in make_keys(tmp_path / "keys")}
    assert written == {"server.key", "server.key_secret", "client.key", "client.key_secret", "authorized/client.key"}
    assert stat.S_IMODE((tmp_path / "keys" / "server.key_secret").stat().st_mode) == 0o600
    assert curve_problems(str(tmp_path / "keys")) == []
    with pytest.raises(FileExistsError, match="already holds keys"):
        make_keys(tmp_path / "keys")


def test_make_keys_writes_a_private_folder_and_never_a_readable_secret_even_for_a_moment(tmp_path, monkeypatch):
    """Issue 34: under a usual umask (022) the folders are 0700 and every file 0600 as it is written (the
    secret was written 0644 and chmodded afterwards); the process umask is given back."""
    import os

    import zmq.auth

    modes = []
    create = zmq.auth.create_certificates

    def recording(folder, name):
        public, secret = create(folder, name)
        modes.append(stat.S_IMODE(os.stat(secret).st_mode))  # right after the write, before anything else
        return public, secret

    monkeypatch.setattr(zmq.auth, "create_certificates", recording)
    old = os.umask(0o022)
    try:
        make_keys(tmp_path / "keys")
        assert os.umask(0o022) == 0o022  # given back
    finally:
        os.umask(old)
    assert modes == [0o600, 0o600]
    for folder in (tmp_path / "keys", tmp_path / "keys" / "authorized"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "keys").rglob("*.key*")} == {0o600}


def test_run_py_keys_makes_a_0700_folder(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "run.py", "keys", str(tmp_path / "k")], cwd=root, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "k" / "client.key_secret").stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o620], ids=lambda m: f"{m:04o}")
def test_a_secret_key_file_others_can_read_or_write_is_a_named_problem(tmp_path, mode):
    """Issue 34: keys are loaded only from secret files no group or other user can read or write."""
    make_keys(tmp_path / "keys")
    secret = tmp_path / "keys" / "server.key_secret"
    secret.chmod(mode)
    assert curve_problems(str(tmp_path / "keys")) == [
        f"transport.curve_dir = {str(tmp_path / 'keys')!r}: {secret} holds a secret key but is readable or writable "
        f"by others (mode {mode:04o}); run `chmod 600 {secret}` (or make new keys with `python run.py keys DIR`)"]


def test_run_py_check_exits_2_for_a_keys_folder_with_a_readable_secret(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    make_keys(tmp_path / "keys")
    secret = tmp_path / "keys" / "client.key_secret"
    secret.chmod(0o644)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "run.py", "check", "--set", f'transport.curve_dir="{tmp_path / "keys"}"'],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"{secret} holds a secret key but is readable" in done.stderr, done.stderr


def test_bad_key_folders_are_named_problems(tmp_path):
    assert curve_problems("") == []
    assert "no such folder" in curve_problems(str(tmp_path / "missing"))[0]
    make_keys(tmp_path / "keys")
    (tmp_path / "keys" / "client.key_secret").unlink()
    (tmp_path / "keys" / "server.key_secret").write_text("not a certificate")
    shutil.rmtree(tmp_path / "keys" / "authorized")
    problems = curve_problems(str(tmp_path / "keys"))
    assert len(problems) == 3, problems
    assert any("client.key_secret does not exist" in p for p in problems)
    assert any("server.key_secret" in p and "secret" in p for p in problems)
    assert any("authorized" in p for p in problems)


def test_config_refuses_a_missing_keys_folder_and_allows_remote_binds_with_keys(tmp_path):
    with pytest.raises(ConfigError, match="curve_dir"):
        load_config(None, [f'transport.curve_dir="{tmp_path / "nope"}"'])
    with pytest.raises(ConfigError, match="curve_dir"):  # a remote bind without keys names the way out
        load_config(None, ['transport.events="tcp://*:5556"'])
    make_keys(tmp_path / "keys")
    cfg = load_config(None, ['transport.events="tcp://*:5556"', f'transport.curve_dir="{tmp_path / "keys"}"'])
    assert cfg.transport.curve_dir == str(tmp_path / "keys")


def _intruder(ctx: zmq.Context, address: str, *, client_keys: tuple[bytes, bytes] | None, server_key: bytes | None) -> zmq.Socket:
    """A raw PUSH that connects with the given keys (None: no CURVE at all) and queues one frame."""
    push = ctx.socket(zmq.PUSH)
    push.linger = 0
    if client_keys is not None:
        push.curve_publickey, push.curve_secretkey = client_keys
        push.curve_serverkey = server_key
    push.connect(address)
    push.send(b"\x2a", zmq.NOBLOCK)  # msgpack 42: a frame the receiver would accept
    return push


async def test_only_listed_keys_get_through_and_refusals_are_counted(tmp_path, monkeypatch):
    refused: dict[str, trio.Event] = collections.defaultdict(trio.Event)  # set when a reason is first counted
    drop = Socket.drop
    monkeypatch.setattr(Socket, "drop", lambda self, reason, detail="": (drop(self, reason, detail), refused[reason].set()))
    make_keys(tmp_path / "keys")
    make_keys(tmp_path / "other")
    server_public, _ = zmq.auth.load_certificate(tmp_path / "keys" / "server.key")
    stranger = zmq.auth.load_certificate(tmp_path / "other" / "client.key_secret")
    raw_ctx = zmq.Context()
    try:
        async with open_context(str(tmp_path / "keys")) as ctx:
            pull = ctx.socket("pull", "tcp://127.0.0.1:0", bind=True, receives=int, name="steps")
            unkeyed = _intruder(raw_ctx, pull.address, client_keys=None, server_key=None)
            with trio.fail_after(20):
                await refused["handshake_failed"].wait()
            unlisted = _intruder(raw_ctx, pull.address, client_keys=stranger, server_key=server_public)
            with trio.fail_after(20):
                await refused["unauthenticated"].wait()
            push = ctx.socket("push", pull.address, bind=False)  # the context's own client key pair
            await push.send(7)
            with trio.fail_after(20):
                assert await pull.receive() == 7
            assert pull.statistics().received == 1  # neither intruder's frame arrived
            assert set(ctx.dropped_frames()["steps"]) == {"handshake_failed", "unauthenticated"}
            unkeyed.close()
            unlisted.close()
    finally:
        raw_ctx.term()


async def test_inproc_sockets_need_no_keys_under_curve(tmp_path):
    make_keys(tmp_path / "keys")
    async with open_context(str(tmp_path / "keys")) as ctx:
        pull = ctx.socket("pull", "inproc://plain", bind=True, receives=int)
        push = ctx.socket("push", "inproc://plain", bind=False)
        await push.send(3)
        with trio.fail_after(20):
            assert await pull.receive() == 3


async def test_key_pairs_made_in_memory_admit_exactly_the_public_keys_they_were_told(monkeypatch):
    """`own_keys` (a Ray actor's own pair): the binder admits the listed public keys only; the connector
    expects the binder's public key. No folder, no secret key leaves the process that made it."""
    refused: dict[str, trio.Event] = collections.defaultdict(trio.Event)
    drop = Socket.drop
    monkeypatch.setattr(Socket, "drop", lambda self, reason, detail="": (drop(self, reason, detail), refused[reason].set()))
    server, client, stranger = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    raw_ctx = zmq.Context()
    try:
        async with open_context(keys=own_keys(*server, admits=frozenset({client[0]}))) as binder, \
                open_context(keys=own_keys(*client, server=server[0])) as connector:
            pull = binder.socket("pull", "tcp://127.0.0.1:0", bind=True, receives=int, name="decoders")
            unlisted = _intruder(raw_ctx, pull.address, client_keys=stranger, server_key=server[0])
            with trio.fail_after(20):
                await refused["unauthenticated"].wait()
            push = connector.socket("push", pull.address, bind=False)
            await push.send(5)
            with trio.fail_after(20):
                assert await pull.receive() == 5
            assert pull.statistics().received == 1
            assert set(binder.dropped_frames()["decoders"]) == {"unauthenticated"}
            unlisted.close()
    finally:
        raw_ctx.term()
