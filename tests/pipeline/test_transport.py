"""ZMQ under Trio: bursts arrive whole, shutdown loses nothing, bad frames are dropped, ipc across processes."""

import subprocess
import sys
import textwrap

import trio

from pipeline.messages import StepEvent, StepStream
from pipeline.transport import open_context


def _step(i: int) -> StepEvent:
    return StepEvent(group_id=i, rollout_index=0, step_index=i, action=f"go to drawer {i}", done=False, reward=0.0, policy_version=0)


async def test_thousands_of_queued_messages_all_arrive():
    n = 5000
    async with open_context() as ctx:
        pull = ctx.socket("pull", "inproc://burst", bind=True, receives=StepStream, hwm=n + 1)
        push = ctx.socket("push", "inproc://burst", bind=False, hwm=n + 1)
        for i in range(n):  # all queued before anyone waits: the edge-triggered FD fires once
            await push.send(_step(i))
        got = []
        with trio.fail_after(10):
            while len(got) < n:
                got += await pull.receive_many()
        assert [m.step_index for m in got] == list(range(n))


async def test_concurrent_sender_and_receiver_tasks_share_one_pair_socket():
    n = 2000
    async with open_context() as ctx:
        a = ctx.socket("pair", "inproc://pair", bind=True, receives=StepStream, hwm=50)
        b = ctx.socket("pair", "inproc://pair", bind=False, receives=StepStream, hwm=50)
        received = {"a": 0, "b": 0}

        async def pump(sock, name):
            for i in range(n):
                await sock.send(_step(i))

        async def drain(sock, name):
            while received[name] < n:
                received[name] += len(await sock.receive_many())

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, a, "a")
                nursery.start_soon(pump, b, "b")
                nursery.start_soon(drain, a, "a")
                nursery.start_soon(drain, b, "b")
        assert received == {"a": n, "b": n}


async def test_malformed_frames_are_counted_and_dropped():
    import random

    rng = random.Random(0)
    async with open_context() as ctx:
        pull = ctx.socket("pull", "inproc://bad", bind=True, receives=StepStream)
        push = ctx.socket("push", "inproc://bad", bind=False)
        for _ in range(50):
            await push.send_bytes(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64))))
        await push.send(_step(7))
        with trio.fail_after(5):
            message = await pull.receive()
        assert message == _step(7)
        assert pull.statistics().dropped_frames == 50


async def test_receive_is_cancellable_and_the_socket_still_works():
    async with open_context() as ctx:
        pull = ctx.socket("pull", "inproc://cancel", bind=True, receives=StepStream)
        push = ctx.socket("push", "inproc://cancel", bind=False)
        with trio.move_on_after(0.05) as scope:
            await pull.receive()
        assert scope.cancelled_caught
        await push.send(_step(1))
        with trio.fail_after(5):
            assert (await pull.receive()).group_id == 1


SENDER = textwrap.dedent(
    """
    import sys, trio
    from pipeline.messages import StepEvent
    from pipeline.transport import open_context

    async def main(address, n):
        async with open_context() as ctx:
            push = ctx.socket("push", address, bind=False, hwm=100, linger_ms=60_000)
            for i in range(n):
                await push.send(StepEvent(group_id=0, rollout_index=0, step_index=i, action="look",
                                          done=False, reward=0.0, policy_version=0))
        # leaving the context runs ctx.term(): everything queued is flushed before the process exits

    trio.run(main, sys.argv[1], int(sys.argv[2]))
    """
)


async def test_second_process_over_ipc_loses_nothing_at_exit(tmp_path):
    # What is tested here is that close + term flush what the sender queued (its SNDHWM of 100 makes it
    # wait on the receiver the whole way). Both ends linger 60 s: ZeroMQ drops what is still queued once a
    # linger runs out. The receiver's queue holds the whole stream: libzmq loses the frames still in flight
    # when the sender's process exits while the receiver's queue is full (zeromq/libzmq#4660, open), which a
    # receiver with RCVHWM 100 hit ~1 run in 10 on a loaded machine (19,951 of 20,000 arrived, sender exit 0).
    n = 20000
    address = f"ipc://{tmp_path}/steps.sock"
    async with open_context() as ctx:
        pull = ctx.socket("pull", address, bind=True, receives=StepStream, hwm=n, linger_ms=60_000)
        root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
        proc = await trio.lowlevel.open_process([sys.executable, "-c", SENDER, address, str(n)], cwd=root)
        got = 0
        last = -1
        with trio.move_on_after(90):
            while got < n:
                for message in await pull.receive_many():
                    assert message.step_index == last + 1
                    last = message.step_index
                    got += 1
            assert await proc.wait() == 0
        assert got == n, f"received {got} of {n} steps (last {last}); sender exit code {proc.poll()}"


async def test_tcp_port_zero_binds_a_free_port():
    async with open_context() as ctx:
        pull = ctx.socket("pull", "tcp://127.0.0.1:0", bind=True, receives=StepStream)
        assert not pull.address.endswith(":0")
        push = ctx.socket("push", pull.address, bind=False)
        await push.send(_step(3))
        with trio.fail_after(5):
            assert (await pull.receive()).step_index == 3


def test_transport_and_curve_are_the_only_modules_importing_zmq():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    offenders = [
        str(p.relative_to(root))
        for folder in ("pipeline", "stages", "gates", "learner")
        for p in (root / folder).rglob("*.py")
        if str(p.relative_to(root)) not in ("pipeline/transport.py", "pipeline/curve.py")
        and ("import zmq" in p.read_text() or "from zmq" in p.read_text())
    ]
    assert offenders == []
    assert subprocess.run([sys.executable, "-c", "import pipeline.transport"], cwd=root).returncode == 0


async def test_drops_are_counted_by_reason_and_warnings_are_rate_limited(monkeypatch):
    import msgspec

    from pipeline import transport

    logged = []
    monkeypatch.setattr(transport.log, "warning", lambda event, **kw: logged.append(event))
    n = 3 * transport.WARN_EVERY
    async with open_context() as ctx:
        pull = ctx.socket("pull", "inproc://limited", bind=True, receives=StepStream, hwm=n + 10, name="steps")
        push = ctx.socket("push", "inproc://limited", bind=False, hwm=n + 10)
        for i in range(n):
            await push.send_bytes([b"", b"\xc1", msgspec.msgpack.encode({"x": 1})][i % 3])
        await push.send(_step(1))
        with trio.fail_after(10):
            assert (await pull.receive()).step_index == 1
        pull.drop("unknown_group")
        stats = pull.statistics()
        assert stats.dropped_by_reason == {"empty": n // 3, "undecodable": n // 3, "wrong_shape": n // 3, "unknown_group": 1}
        assert ctx.dropped_frames() == {"steps": stats.dropped_by_reason}
    assert logged.count("transport.bad_frame") == transport.WARN_FIRST
    assert logged.count("transport.bad_frames") == 3  # one summary line per WARN_EVERY drops


async def test_a_sealed_socket_drops_what_strangers_send_as_bad_token(monkeypatch):
    """Issue 34: the run's sockets accept only messages sealed with its secret. A well-formed message sent
    bare (a stranger's context) or sealed with another secret, a lone tag, a tag that does not match and a
    three-frame message are all counted as `bad_token`; the secret never appears in a log line."""
    import msgspec

    from pipeline import sealing, transport

    logged = []
    monkeypatch.setattr(transport.log, "warning", lambda event, **kw: logged.append(repr(kw)))
    secret, other = sealing.new_secret(), sealing.new_secret()
    payload = msgspec.msgpack.encode(_step(1))
    async with open_context(secret=secret) as run:
        pull = run.socket("pull", "tcp://127.0.0.1:0", bind=True, receives=StepStream, name="steps")
        push = run.socket("push", pull.address, bind=False)
        raw = push._raw  # what other senders put on the wire, on one connection so that it arrives in order
        stream, header = sealing.stream_of(pull.address), sealing.HEADER.pack(b"\x00" * 8, 1)
        raw.send(payload)  # a stranger's context sends bare frames
        raw.send_multipart([sealing.frame_tag(other, stream, header, payload), header, payload])  # another run's secret
        raw.send(sealing.frame_tag(secret, stream, header, payload))  # a tag without its payload
        raw.send_multipart([sealing.frame_tag(secret, stream, header, b"x"), header, payload])  # a tag of other bytes
        raw.send_multipart([sealing.frame_tag(secret, stream, header, payload), header, payload, b""])
        await push.send(_step(2))  # sealed by this run's context
        with trio.fail_after(10):
            assert [m.step_index for m in await pull.receive_many()] == [2]
    assert run.dropped_frames()["steps"] == {"bad_token": 5}
    assert len(logged) == 5 and secret.hex() not in "".join(logged) and repr(secret) not in "".join(logged)



async def test_a_sealed_frame_recorded_on_the_path_is_dropped_when_replayed():
    """Issue 60: an observer on the path (`transport.allow_remote` without CURVE) records sealed frames, e.g. a
    learner's `GroupExpected` + `GroupResult`, and sends them again: each is dropped as `replayed`, counted. Sent
    to another stream of the run, they are `bad_token`: a seal holds for its stream only."""
    import msgspec
    import zmq

    from pipeline import sealing

    secret = sealing.new_secret()
    async with open_context(secret=secret) as run:
        tap = run._ctx.socket(zmq.PULL)  # the observer: it sees what the sender puts on the wire
        port = tap.bind_to_random_port("tcp://127.0.0.1")
        push = run.socket("push", f"tcp://127.0.0.1:{port}", bind=False)
        await push.send(_step(1))
        await push.send(_step(2))
        recorded = [tap.recv_multipart(), tap.recv_multipart()]
        tap.close(linger=0)
        with trio.fail_after(10):  # zmq frees the tap's port in its own thread: no event says when
            while True:
                try:
                    pull = run.socket("pull", f"tcp://127.0.0.1:{port}", bind=True, receives=StepStream, name="steps")
                    break
                except OSError:
                    await trio.sleep(0.01)
        other = run.socket("pull", "tcp://127.0.0.1:0", bind=True, receives=StepStream, name="results")
        last = msgspec.msgpack.encode(_step(9))
        for sock in (pull, other):  # one connection each, so that the last (a fresh sender's) arrives after the rest
            forger = run._ctx.socket(zmq.PUSH)
            forger.connect(sock.address)
            for message in [*recorded, *recorded] if sock is pull else recorded:  # to pull: first delivery, then replays
                forger.send_multipart(message)
            forger.send_multipart(sealing.Sealer(secret, sealing.stream_of(sock.address)).seal(last))
            forger.close(linger=5_000)
        with trio.fail_after(10):
            assert [(await pull.receive()).step_index for _ in range(3)] == [1, 2, 9]
            assert (await other.receive()).step_index == 9
        push.close()
    assert run.dropped_frames()["steps"] == {"replayed": 2} and run.dropped_frames()["results"] == {"bad_token": 2}
