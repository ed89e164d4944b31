"""Stop a run and resume it from its folder: Ctrl-C after the first update writes a checkpoint and exits
130 promptly, `run.py resume` reaches the configured updates, and the summary counts every update once.
Also: no orphan threads or child processes after an interrupted run."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest
import trio

from pipeline.progress import Progress
from pipeline.run.checks import load
from pipeline.run.job import RunInterrupted, run_job
from tests.plugin_faults import STOPS
from tests.test_run_integration import BASE, ROOT, _tiny


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid`, from the process table."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_ctrl_c_after_first_update_then_resume_reaches_the_configured_updates(tmp_path):
    sets = _tiny(tmp_path, "gate.k=4", "run.updates=4", "run.name=stopped", "run.keep_weights_every=1", "eval.curve_off_clock=true")
    args = [sys.executable, "run.py", *BASE, *[a for s in sets for a in ("--set", s)]]
    run_dir = tmp_path / "runs" / "stopped"
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 180
        while not _metrics(run_dir) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        proc.wait(timeout=30)
        stop_s = time.monotonic() - sent
        stderr = proc.stderr.read()
        assert proc.returncode == 130, stderr
        assert stop_s < 20.0, stop_s  # ~2 s idle; the bound catches a hang, not a slow machine
        print(f"SIGINT to exit: {stop_s:.2f} s")
        assert _children(proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "checkpoint at update" in stderr and "run.py resume" in stderr, stderr
    stopped_at = int(re.search(r"checkpoint at update (\d+)", stderr).group(1))
    assert 1 <= stopped_at < 4
    assert (run_dir / "checkpoints" / "state.pt").exists()
    assert json.loads((run_dir / "summary.json").read_text())["stop_reason"] == "interrupted"
    assert not (run_dir / "heldout_curve.jsonl").exists()  # an interrupted run measures no curve: its resume does

    # resumed on another held-out range: its before measure is taken again, on the checkpoint's weights, and says so
    resumed = subprocess.run([sys.executable, "run.py", "resume", str(run_dir), "--set", "run.progress=false",
                              "--set", 'eval.range="valid"'], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "run.progress: True -> False" in resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = _metrics(run_dir)
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]  # appended after the checkpoint, none twice
    assert summary["learner_updates"] == 4
    assert summary["stop_reason"] == "updates"
    assert summary["groups_trained"] == rows[-1]["groups_trained"]
    assert summary["groups_trained"] >= 4 * 2 - 0  # B = 2 groups per update, drop_zero_variance off
    assert summary["env_steps"] >= rows[-1]["env_steps"] > rows[stopped_at - 1]["env_steps"]  # steps go on until the phase ends
    assert summary["grpo_wall_s"] >= rows[stopped_at - 1]["wall_s"]
    assert summary["heldout_success_after"] is not None and summary["peak_rss_mb"] > 0
    assert summary["heldout_range"] == "valid" and summary["heldout_before_version"] == stopped_at
    ledger = summary["ledger"]  # the work of groups in flight at the checkpoint is unfinished, none lost
    assert sum(f["env_steps"] for f in ledger["fates"].values()) == ledger["env_steps"] == summary["env_steps"]
    assert ledger["fates"]["trained_informative"]["groups"] + ledger["fates"]["trained_zero_variance"]["groups"] == \
        summary["groups_trained"]
    commits = [json.loads(line) for line in (run_dir / "commits.jsonl").read_text().splitlines()]
    assert [c["resumed"] for c in commits] == [False, True] and summary["run_commits"] == commits  # appended
    curve = [json.loads(line) for line in (run_dir / "heldout_curve.jsonl").read_text().splitlines()]
    # every version kept, before the stop and after the resume, measured once, stamped from its own metrics row
    assert [(r["iteration"], r["wall_s"], r["generated_tokens"]) for r in curve] == [
        (r["iteration"], r["wall_s"], r["generated_tokens"]) for r in rows]


@pytest.mark.slow
def test_resume_refuses_overrides_that_change_what_the_checkpoint_holds(tmp_path):
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    from pipeline.config import dump_toml

    (run_dir / "config.toml").write_text(dump_toml(load(None, _tiny(tmp_path, "gate.k=4"))))
    proc = subprocess.run(
        [sys.executable, "run.py", "resume", str(run_dir), "--set", "rollout.group_size=6", "--set", "allocator.name=dapo"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "rollout.group_size: 4 -> 6" in proc.stderr and "allocator.name" in proc.stderr, proc.stderr
    not_a_run = subprocess.run([sys.executable, "run.py", "resume", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert not_a_run.returncode == 2 and "not a run folder" in not_a_run.stderr


@pytest.mark.slow
async def test_stop_leaves_no_busy_thread_and_a_resumable_folder(tmp_path):
    stop = STOPS["inproc"] = trio.Event()
    observer = 'stages=[{target = "tests.plugin_faults:StopAfter", options = {key = "inproc", updates = 1}}]'
    cfg = load(None, _tiny(tmp_path, "gate.k=4", "run.updates=50", "run.name=inproc", observer))
    run_dir = tmp_path / "runs" / "inproc"
    with pytest.raises(RunInterrupted) as info:
        await run_job(cfg, progress=Progress(50, enabled=False), stop=stop)
    assert info.value.version is not None and info.value.version >= 1
    assert json.loads((run_dir / "summary.json").read_text())["learner_updates"] == info.value.version
    assert (run_dir / "checkpoints" / "state.pt").exists()
    assert _threads_running_rollcut_code() == []  # nothing still runs for the stopped job


def _threads_running_rollcut_code() -> list[str]:
    """Threads (other than this one) whose current stack is inside rollcut's own packages: idle pooled
    workers of Trio or torch may remain, but none may still be working for a stopped job."""
    packages = tuple(str(ROOT / name) + "/" for name in ("pipeline", "stages", "learner", "gates"))
    me = threading.get_ident()
    busy = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        files = [f.filename for f in traceback.extract_stack(frame)]
        if any(name.startswith(packages) for name in files):
            busy.append(next((t.name for t in threading.enumerate() if t.ident == ident), str(ident)))
    return busy


class _Planted:
    """A pickle that runs code when loaded: it creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("planted", [True, False], ids=["a planted pickle", "one line of text"])
def test_resume_refuses_a_checkpoint_it_cannot_load_safely_in_one_line(tmp_path, planted):
    """Whoever can write a run folder cannot run code in the next `resume`; a damaged checkpoint is one line, exit 2."""
    from pipeline.config import dump_toml

    run_dir = tmp_path / "runs" / "shared"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.toml").write_text(dump_toml(load(None, [f'run.out="{tmp_path}/runs"', 'run.name="shared"'])))
    state, marker = run_dir / "checkpoints" / "state.pt", tmp_path / "ran"
    if planted:
        import torch

        torch.save({"format": 2, "version": 1, "job": _Planted(marker)}, state)
    else:
        state.write_text("a new user's line\n")
    proc = subprocess.run([sys.executable, "run.py", "resume", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(state) in lines[0], proc.stderr
    assert not marker.exists()
