"""Fuzzed sockets and forged messages while a tiny run goes on (tcp, as across hosts): >= 10,000 bad
frames to each bound socket, 0 crashes, every bad frame counted in summary.json; and well-formed forgeries
from a stranger (cuts with the run's gate name and shadow flag, in-order steps, announced training groups,
learner reports) about live groups: every one dropped as `bad_token`, none cuts, trains or reports."""

import json
import socket

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
