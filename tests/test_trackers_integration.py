"""A tiny run with `run.trackers = ["tensorboard", "mlflow", "wandb"]`, stopped after its first update and
resumed: each tracker holds the run's curves, read back with its own library's reader, and the resumed run
appended to the same tracker runs. A tracker without its package is a config error before the warm start."""

import json
import os
import subprocess
import sys

import pytest
import trio

from pipeline.progress import Progress
from pipeline.run.checks import load
from pipeline.run.job import RunInterrupted, run_job
from tests import plugin_trackers as read
from tests.plugin_faults import STOPS
from tests.test_run_integration import ROOT, _tiny

TRACKED = 'run.trackers=["tensorboard", "mlflow", "wandb"]'


@pytest.mark.slow
async def test_a_stopped_and_resumed_run_leaves_readable_tracker_data(tmp_path, monkeypatch):
    read.offline(monkeypatch)
    stop = STOPS["trackers"] = trio.Event()
    observer = 'stages=[{target = "tests.plugin_faults:StopAfter", options = {key = "trackers", updates = 1}}]'
    cfg = load(None, _tiny(tmp_path, "gate.k=4", "run.updates=3", "run.name=tracked", "eval.every=1", TRACKED, observer))
    run_dir = tmp_path / "runs" / "tracked"
    with pytest.raises(RunInterrupted):
        await run_job(cfg, progress=Progress(3, enabled=False), stop=stop)
    ids = json.loads((run_dir / "trackers.json").read_text())
    await run_job(load(run_dir / "config.toml", []), progress=Progress(3, enabled=False), resume_dir=run_dir)
    assert json.loads((run_dir / "trackers.json").read_text()) == ids  # the same tracker runs, appended to

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r["iteration"] for r in rows if "success_rate" in r]
    assert updates == [1, 2, 3]
    heldout = sorted(r["iteration"] for r in rows if "heldout/mean" in r)
    assert heldout
    summary = json.loads((run_dir / "summary.json").read_text())

    scalars = read.tensorboard_scalars(run_dir / "tensorboard")
    assert [step for step, _ in scalars["env_steps"]] == updates
    assert [step for step, _ in scalars["heldout/mean"]] == heldout
    assert scalars["summary/learner_updates"][-1] == (3, 3.0)  # (the interrupted part logged its own summary too)
    assert read.tensorboard(run_dir / "tensorboard").Images("images/profile")

    client = read.mlflow_client(run_dir)
    run = client.get_run(ids["mlflow"])
    assert run.info.status == "FINISHED" and run.data.params["run.updates"] == "3"
    env_steps = read.mlflow_history(client, ids["mlflow"], "env_steps")
    assert sorted({step for step, _ in env_steps}) == updates
    assert env_steps[-1] == (3, float([r for r in rows if "success_rate" in r][-1]["env_steps"]))
    assert read.mlflow_history(client, ids["mlflow"], "summary/learner_updates")[-1] == (3, float(summary["learner_updates"]))
    assert "images/profile.png" in [a.path for a in client.list_artifacts(ids["mlflow"], "images")]

    files = read.wandb_files(run_dir)
    assert len(files) == 2  # the run, then its resume: one W&B run id
    records = [read.wandb_records(f) for f in files]
    assert {read.wandb_run(r)["run_id"] for r in records} == {ids["wandb"]}
    logged = {h["iteration"] for r in records for h in read.wandb_history(r) if "env_steps" in h}
    assert logged >= set(updates)
    assert read.wandb_summary(records[1])["summary/learner_updates"] == 3


def test_a_tracker_without_its_package_stops_the_run_before_the_warm_start(tmp_path):
    # sys.modules[name] = None is how Python marks a module that cannot be imported: as if wandb were absent
    code = "import sys; sys.modules['wandb'] = None; import run; sys.exit(run.main(sys.argv[1:]))"
    args = [a for s in _tiny(tmp_path, TRACKED, "run.name=missing") for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=os.environ | read.OFFLINE)
    assert done.returncode == 2, done.stderr
    assert "run.trackers: 'wandb' needs the wandb package: pip install 'rollcut[wandb]'" in done.stderr
    assert not (tmp_path / "runs" / "missing").exists()  # nothing started: no run folder, no warm start
    assert not (tmp_path / "cache").exists()
