"""A tiny run over tcp with CURVE keys: the run's own sockets (and a keyed observer stage) work, while
unkeyed and unlisted peers connecting to every bound socket are refused and counted in summary.json."""

import json

import pytest
import trio
import zmq

from pipeline.curve import make_keys
from pipeline.progress import Progress
from pipeline.run.checks import load
from pipeline.run.job import RunInterrupted, run_job
from tests.plugin_curve import SEEN
from tests.plugin_faults import STOPS
from tests.test_fuzz_integration import _free_port
from tests.test_run_integration import _tiny


@pytest.mark.slow
@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
async def test_a_curve_run_refuses_unkeyed_and_unlisted_peers_and_trains(tmp_path):
    make_keys(tmp_path / "keys")
    make_keys(tmp_path / "stranger")
    stop = STOPS["curve"] = trio.Event()
    addresses = [f'transport.{name}="tcp://127.0.0.1:{_free_port()}"' for name in ("steps", "control", "results", "events")]
    options = f'{{key = "curve", keys_dir = "{tmp_path / "keys"}", stranger_dir = "{tmp_path / "stranger"}"}}'
    cfg = load(None, _tiny(
        tmp_path, *addresses, f'transport.curve_dir="{tmp_path / "keys"}"', "run.updates=1000", "run.max_wall_s=240",
        "gate.k=1", "run.name=curve", f'stages=[{{target = "tests.plugin_curve:Intruders", options = {options}}}]',
    ))
    with pytest.raises(RunInterrupted):  # the intruding stage stops the run once every refusal is counted
        await run_job(cfg, progress=Progress(1000, enabled=False), stop=stop)
    summary = json.loads((tmp_path / "runs" / "curve" / "summary.json").read_text())
    print(json.dumps(summary["dropped_frames"], indent=1), SEEN["curve"])
    assert SEEN["curve"]["updates"] >= 1  # the keyed subscriber saw the run; results reached the learner over CURVE
    assert summary["learner_updates"] >= 1 and summary["env_steps"] > 0
    refused = {name: counts for name, counts in summary["dropped_frames"].items()
               if counts.get("handshake_failed") and counts.get("unauthenticated")}
    assert len(refused) == 4, summary["dropped_frames"]  # steps, control, results and the event stream
    real = {"undecodable", "empty", "wrong_shape"}
    assert not any(real & set(counts) for counts in summary["dropped_frames"].values())  # no intruder frame arrived
