"""Fuzzed sockets and forged messages while a tiny run goes on (tcp, as across hosts): >= 10,000 bad
frames to each bound socket, 0 crashes, 0 forged cuts, every bad frame counted in summary.json."""

import json
import socket

import pytest
import trio

from pipeline.job import RunInterrupted, load, run_job
from pipeline.progress import Progress
from tests.plugin_faults import STOPS
from tests.plugin_fuzz import RESULTS
from tests.test_run_integration import _tiny


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
async def test_ten_thousand_bad_frames_per_socket_are_dropped_and_counted(tmp_path):
    stop = STOPS["fuzz"] = trio.Event()
    addresses = [f'transport.{name}="tcp://127.0.0.1:{_free_port()}"' for name in ("steps", "control", "results", "events")]
    cfg = load(None, _tiny(
        tmp_path, *addresses, 'gate.name="tests.plugin_fuzz:ForgedActionGate"', "run.updates=1000",
        "run.max_wall_s=240", "run.name=fuzz",
        'stages=[{target = "tests.plugin_fuzz:Fuzzer", options = {key = "fuzz", frames = 10000}}]',
    ))
    with pytest.raises(RunInterrupted):  # the fuzzer stops the run once every frame is counted
        await run_job(cfg, progress=Progress(1000, enabled=False), stop=stop)
    fuzzer = RESULTS["fuzz"]
    summary = json.loads((tmp_path / "runs" / "fuzz" / "summary.json").read_text())
    dropped = summary["dropped_frames"]
    print("sent", fuzzer.sent, "dropped", json.dumps(dropped, indent=1))
    assert all(n >= 10_000 for n in fuzzer.sent.values()) and set(fuzzer.sent) == {"steps", "control", "results"}
    for name, sent in fuzzer.sent.items():
        assert sum(dropped[name].values()) == sent, name  # every bad frame counted, no real one dropped
    assert summary["groups_cut"] == 0  # no forged step or cut got through
    assert summary["learner_updates"] >= 1 and summary["env_steps"] > 0  # the run went on
    assert summary["trajectories_failed"] == 0
    for reason in ("undecodable", "empty", "wrong_shape", "unknown_group", "rollout_index_out_of_range", "step_out_of_order"):
        assert dropped["steps"].get(reason, 0) > 0, reason
    for reason in ("unknown_group", "unknown_gate", "shadow_mismatch"):
        assert dropped["control"].get(reason, 0) > 0, reason
    assert dropped["results"].get("unknown_group", 0) > 0  # (malformed trajectories: tests/learner/test_validation.py)
