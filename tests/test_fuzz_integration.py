"""Fuzzed sockets and forged messages while a tiny run goes on (tcp, as across hosts): >= 10,000 bad
frames to each bound socket, 0 crashes, every bad frame counted in summary.json; and well-formed forgeries
from a stranger (cuts with the run's gate name and shadow flag, in-order steps, announced training groups,
learner reports) about live groups: every one dropped as `bad_token`, none cuts, trains or reports."""

import json
import os
import socket
import struct

import pytest
import trio

from pipeline.progress import Progress
from pipeline.run.checks import load
from pipeline.run.job import RunInterrupted, run_job
from tests.plugin_faults import STOPS
from tests.plugin_fuzz import RESULTS, WINDOW
from tests.test_run_integration import _tiny


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _fuzzed_run(tmp_path, key: str, fuzzer_options: str, *extra: str, processes: bool = False) -> tuple[dict, object]:
    """A tiny run on tcp addresses with the fuzzer stage; it stops the run once every frame it sent is
    counted and the first learner update is in (`plugin_fuzz.Fuzzer`). Returns the summary and the fuzzer."""
    stop = STOPS[key] = trio.Event()
    names = ("steps", "control", "results", "events", *(("reports",) if processes else ()))
    addresses = [f'transport.{name}="tcp://127.0.0.1:{_free_port()}"' for name in names]
    cfg = load(None, _tiny(
        tmp_path, *addresses, 'gate.name="tests.plugin_fuzz:ForgedActionGate"', "run.updates=1000", f"run.name={key}",
        f'stages=[{{target = "tests.plugin_fuzz:Fuzzer", options = {{key = "{key}", {fuzzer_options}}}}}]', *extra,
    ))
    with pytest.raises(RunInterrupted):  # the fuzzer stops the run (the run has 1000 updates to go)
        await run_job(cfg, progress=Progress(1000, enabled=False), stop=stop)
    summary = json.loads((tmp_path / "runs" / key / "summary.json").read_text())
    return summary, RESULTS[key]


def _assert_forgeries_dropped(fuzzer, summary: dict) -> None:
    """Every well-formed forgery was dropped as bad_token, about groups the run did start; none got through."""
    dropped = summary["dropped_frames"]
    print("forged (well-formed, from a stranger):", json.dumps(fuzzer.forged),
          "dropped as bad_token:", json.dumps({name: dropped[name].get("bad_token", 0) for name in fuzzer.forged}),
          "group ids named:", len(set(fuzzer.targets)), f"({min(fuzzer.targets)}..{max(fuzzer.targets)}),",
          "groups admitted:", summary["groups_admitted"], "cut:", summary["groups_cut"],
          "learner updates:", summary["learner_updates"])
    assert len(fuzzer.targets) == fuzzer.options.rounds * WINDOW
    assert max(fuzzer.targets) < summary["groups_admitted"]  # live ids: the run started every group named
    for name, n in fuzzer.forged.items():
        assert dropped[name].get("bad_token", 0) == n, name  # each forgery dropped at the seal, nothing else
    assert summary["groups_cut"] == 0  # no forged cut (right gate, right shadow flag) and no forged step got through
    assert summary["learner_updates"] >= 1 and summary["trajectories_failed"] == 0  # the run went on


@pytest.mark.slow
async def test_ten_thousand_bad_frames_per_socket_are_dropped_and_counted(tmp_path):
    summary, fuzzer = await _fuzzed_run(tmp_path, "fuzz", "frames = 10000")
    dropped = summary["dropped_frames"]
    print("sent", fuzzer.sent, "forged", fuzzer.forged, "dropped", json.dumps(dropped, indent=1))
    assert all(n >= 10_000 for n in fuzzer.sent.values()) and set(fuzzer.sent) == {"steps", "control", "results"}
    for name, sent in fuzzer.sent.items():  # every bad frame counted, no real one dropped
        assert sum(dropped[name].values()) == sent + fuzzer.forged[name], name
    assert summary["env_steps"] > 0
    _assert_forgeries_dropped(fuzzer, summary)
    for reason in ("undecodable", "empty", "wrong_shape", "unknown_group", "rollout_index_out_of_range", "step_out_of_order"):
        assert dropped["steps"].get(reason, 0) > 0, reason
    for reason in ("unknown_group", "unknown_gate", "shadow_mismatch"):
        assert dropped["control"].get(reason, 0) > 0, reason
    assert dropped["results"].get("unknown_group", 0) > 0  # (malformed trajectories: tests/learner/test_validation.py)


@pytest.mark.slow
async def test_forged_cuts_announcements_and_reports_never_reach_stages_in_other_processes(tmp_path):
    """`transport.mode = "processes"`: the learner takes announcements from its results socket and the run
    takes learner reports from the reports socket. A stranger's well-formed ones, and its cuts and steps,
    are all dropped (the stage processes report their counts), and a forged report's pickle never runs."""
    touch = tmp_path / "touched"
    summary, fuzzer = await _fuzzed_run(tmp_path, "forged", f'frames = 0, forge_reports = true, touch = "{touch}"',
                                        "transport.mode=processes", processes=True)
    assert set(fuzzer.forged) == {"steps", "control", "results", "reports"}
    _assert_forgeries_dropped(fuzzer, summary)
    assert not touch.exists()
    assert summary["dropped_frames_total"] == sum(fuzzer.forged.values())  # nothing real was dropped


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _send_one_huge_frame(port: int, declared: int, sent: int) -> int:
    """What a local stranger can do to a loopback tcp port: speak ZMTP 3.0 (NULL mechanism, as a PUSH) and send one
    frame whose header declares `declared` bytes, then up to `sent` bytes of it. Returns how many went out before
    the peer closed the connection."""
    greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31
    ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 4) + b"PUSH"
    chunk, out = b"\x00" * (1 << 20), 0
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(greeting)
        s.recv(64)  # the peer's greeting (and READY): the handshake is NULL, nothing to check
        s.sendall(b"\x04" + bytes([len(ready)]) + ready)
        s.settimeout(30)
        try:
            s.sendall(b"\x02" + struct.pack(">Q", declared))  # a long message frame, the last of its message
            while out < sent:
                s.sendall(chunk)
                out += len(chunk)
        except OSError:  # reset by the peer: refused from its header
            pass
    return out


async def test_a_frame_over_the_socket_limit_is_refused_from_its_header_with_memory_flat():
    """Issue 60: any local user could send one multi-GB frame to a loopback tcp port and exhaust the run's memory
    before the secret is even checked. Every socket takes frames up to its role's size (`ZMQ_MAXMSGSIZE`): libzmq
    refuses a bigger one from its header, before allocating it, and drops that connection; the socket goes on."""
    import msgspec

    from pipeline import sealing
    from pipeline.messages import StepEvent, StepStream
    from pipeline.transport import MESSAGE_FRAME_BYTES, open_context

    declared, sent = 4 * MESSAGE_FRAME_BYTES, 3 * MESSAGE_FRAME_BYTES  # a frame 4x the limit; 192 MiB of it sent
    async with open_context(secret=sealing.new_secret()) as run:
        pull = run.socket("pull", "tcp://127.0.0.1:0", bind=True, receives=StepStream, name="steps")
        port = int(pull.address.rsplit(":", 1)[1])
        before = _rss_bytes()
        went_out = await trio.to_thread.run_sync(_send_one_huge_frame, port, declared, sent)
        grown = _rss_bytes() - before
        push = run.socket("push", pull.address, bind=False)
        step = StepEvent(group_id=1, rollout_index=0, step_index=3, action="look", done=False, reward=0.0, policy_version=0)
        await push.send(step)
        with trio.fail_after(10):
            assert await pull.receive() == step  # the socket goes on; the run's own frames get through
    print(f"declared {declared >> 20} MiB, sent {went_out >> 20} MiB before the reset, RSS grew {grown >> 20} MiB")
    assert went_out < sent  # the connection was dropped before the frame was all sent
    assert grown < 32 << 20  # memory flat: the frame was never allocated nor held
    assert msgspec.msgpack.encode(step)  # (what a real step weighs: a few dozen bytes, far under the limit)
