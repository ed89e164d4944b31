"""`transport.mode = "processes"`: the gate and learner stages each in a process of their own. A tiny run
reaches its updates and leaves no process behind; Ctrl-C mid-run stops every child at once, and the run
resumes from its checkpoint (the trainer state came over the reports socket)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_resume_integration import _children, _metrics
from tests.test_run_integration import BASE, ROOT, _tiny


def _stage_processes(pid: int) -> list[int]:
    """Children of `pid` running a stage (`python -m pipeline.run.launch gate|learner SPEC`)."""
    out = []
    for child in _children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pipeline.run.launch" in cmdline and {b"gate", b"learner"} & set(cmdline):
            out.append(child)
    return out


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _start(tmp_path: Path, name: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    sets = _tiny(tmp_path, "transport.mode=processes", "gate.k=4", f"run.name={name}", *extra)
    args = [sys.executable, "run.py", *BASE, *[a for s in sets for a in ("--set", s)]]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    return proc, tmp_path / "runs" / name


def _wait_for(condition, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # another process: no event to wait on


@pytest.mark.slow
def test_a_run_with_stages_in_processes_reaches_its_updates_and_leaves_no_process(tmp_path):
    # env options reach the learner's own copy of the suite (a keyword table once failed there)
    proc, run_dir = _start(tmp_path, "procs", "run.updates=3",
                           "env.options.recovery=mixed")
    seen: list[int] = []
    try:
        _wait_for(lambda: len(_stage_processes(proc.pid)) == 2, proc, 180)
        seen = _stage_processes(proc.pid)
        assert len(seen) == 2, proc.stderr.read() if proc.poll() is not None else "no stage processes"
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _alive(seen) == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["learner_updates"] == 3 and summary["stop_reason"] == "updates"
    assert [r["iteration"] for r in _metrics(run_dir)] == [1, 2, 3]
    assert summary["dropped_frames_total"] == 0
    _assert_the_gate_process_reported_its_last_statistics(summary, _metrics(run_dir))
    _assert_the_saved_policy_is_the_last_update(run_dir, 3)


def _assert_the_saved_policy_is_the_last_update(run_dir: Path, version: int) -> None:
    """checkpoints/policy.pt holds the weights the last update published (the learner's process trained them)."""
    import torch

    from learner.trainer import published_weights
    from pipeline.run.resume import load_state

    state = load_state(run_dir)
    assert state is not None and state["version"] == version
    last = published_weights(state["trainer"])
    saved = torch.load(run_dir / "checkpoints" / "policy.pt", weights_only=True)
    assert saved.keys() == last.keys() and all(torch.equal(saved[k], last[k]) for k in last)


def _assert_the_gate_process_reported_its_last_statistics(summary: dict, rows: list[dict]) -> None:
    """The gate's figures in the summary are the final report it sends when stopped (a tiny phase can end
    before its first periodic report), with the counts an in-process gate's summary has."""
    assert summary["gate_us_per_decision"] is not None and summary["gate_cpu_us_per_decision"] is not None
    seen, decided = summary["gate_groups_seen_by_kind"], summary["gate_decisions_by_kind"]
    assert seen.get("group", 0) >= 1 and sum(decided.values()) >= 1
    assert all(type(n) is int for n in [*seen.values(), *decided.values()])
    reported = [r["gate/groups_seen"] for r in rows if "gate/groups_seen" in r]  # periodic reports, if any came
    assert sum(seen.values()) >= max(reported, default=0)  # the last report, not an older one


@pytest.mark.slow
def test_ctrl_c_stops_every_stage_process_and_the_run_resumes(tmp_path):
    proc, run_dir = _start(tmp_path, "stopped", "run.updates=4")
    try:
        _wait_for(lambda: _metrics(run_dir), proc, 180)
        assert proc.poll() is None, proc.stderr.read()
        children = _stage_processes(proc.pid)
        assert len(children) == 2
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        stderr = proc.stderr.read()
        assert proc.returncode == 130, stderr
        assert _children(proc.pid) == [] and _alive(children) == []
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (run_dir / "checkpoints" / "state.pt").exists(), stderr
    resumed = subprocess.run([sys.executable, "run.py", "resume", str(run_dir), "--set", "run.progress=false"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["learner_updates"] == 4 and summary["stop_reason"] == "updates"
    assert [r["iteration"] for r in _metrics(run_dir)] == [1, 2, 3, 4]
    fates = summary["ledger"]["fates"]  # the learner process said which groups it trained, by id
    assert fates["trained_informative"]["groups"] + fates["trained_zero_variance"]["groups"] == summary["groups_trained"]
    assert sum(f["env_steps"] for f in fates.values()) == summary["env_steps"]


def _stage_named(pids: list[int], stage: bytes) -> int:
    (pid,) = [p for p in pids if stage in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")]
    return pid


@pytest.mark.slow
def test_a_stage_process_that_dies_stops_the_run_naming_it(tmp_path):
    proc, _ = _start(tmp_path, "killed", "run.updates=50")
    try:
        _wait_for(lambda: len(_stage_processes(proc.pid)) == 2, proc, 180)
        children = _stage_processes(proc.pid)
        os.kill(_stage_named(children, b"learner"), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr
    assert "stage 'learner': its process exited with code -9" in stderr, stderr
    assert _alive(children) == []


@pytest.mark.slow
def test_stage_processes_exit_when_the_run_process_dies(tmp_path):
    proc, _ = _start(tmp_path, "orphaned", "run.updates=50")
    try:
        _wait_for(lambda: len(_stage_processes(proc.pid)) == 2, proc, 180)
        children = _stage_processes(proc.pid)
        assert len(children) == 2
        proc.kill()  # no cleanup runs in the parent: the children notice on their own
        proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.1)  # other processes: no event to wait on
        assert _alive(children) == []
    finally:
        if proc.poll() is None:
            proc.kill()


CUSTOM_IN_A_PROCESS = 'stages=[{target = "tests.plugin_stages:SeenToFile", process = true}]'


@pytest.mark.slow
async def test_a_custom_stage_in_a_process_of_its_own_reads_the_events_to_the_end(tmp_path):
    from pipeline.progress import Progress
    from pipeline.run.checks import load
    from pipeline.run.job import run_job

    cfg = load(None, _tiny(tmp_path, "transport.mode=processes", "gate.k=4", "run.updates=3", CUSTOM_IN_A_PROCESS))
    result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    seen = json.loads((result.run_dir / "seen.json").read_text())
    assert seen["pid"] != os.getpid()  # it ran in a child, built there from the config
    assert seen["versions"] == [1, 2, 3] and seen["updates"] == 3  # every version, then PhaseFinished
    assert result.summary["learner_updates"] == 3 and result.summary["dropped_frames_total"] == 0
    assert _alive([seen["pid"]]) == []


@pytest.mark.slow
async def test_a_custom_stage_process_that_raises_stops_the_run_naming_it(tmp_path):
    from pipeline.progress import Progress
    from pipeline.run.checks import load
    from pipeline.run.job import RunFailed, run_job

    explodes = 'stages=[{target = "tests.plugin_stages:Explodes", process = true}]'
    cfg = load(None, _tiny(tmp_path, "transport.mode=processes", "gate.k=4", "run.updates=5", explodes))
    with pytest.raises(RunFailed) as failed:
        await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    assert "stage 'custom-0': its process (tests.plugin_stages:Explodes) exited with code 1" in str(failed.value)
