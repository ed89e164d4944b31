"""Each tracker writes what the run gives it, and a resumed run appends to the same tracker run; read back
with TensorBoard's event accumulator, W&B's transaction-log reader and MLflow's client."""

import json
import sys

import pytest

from pipeline.config import dump_toml, load_config
from pipeline.trackers import IDS_FILE, TrackerRun, Trackers, finish_run, tracker_problems
from pipeline.trackers._wandb import wandb_mode
from tests import plugin_trackers as read

ROWS = [
    {"iteration": 1, "wall_s": 3.0, "success_rate": 0.25, "learner/approx_kl": 0.01, "gate/tau": None, "note": "x"},
    {"iteration": 2, "wall_s": 6.0, "success_rate": 0.5, "learner/approx_kl": 0.02},
    {"iteration": 2, "wall_s": 7.5, "env_steps": 640, "eval_s": 1.5, "heldout/mean": 0.3, "heldout/seen": 0.4},
]
FIGURES = {"learner_updates": 2, "heldout_success_after": 0.3, "groups_by_family": {"clean": 3}, "stop_reason": "updates"}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    read.offline(monkeypatch)


def _run(tmp_path, resume_step=None):
    cfg = load_config(None, ["learner.lr=0.001"])
    import msgspec

    return TrackerRun(tmp_path, tmp_path.name, msgspec.to_builtins(cfg), dump_toml(cfg), resume_step=resume_step)


def _write(trackers, rows, tmp_path):
    for row in rows:
        trackers.log_row(row)
    (tmp_path / "profile.png").write_bytes(read.png(3, 2))
    trackers.finish(FIGURES, {"profile": tmp_path / "profile.png"})
    trackers.close(True)


def test_tensorboard_holds_rows_heldout_summary_config_and_image(tmp_path):
    trackers = Trackers.open(["tensorboard"], {}, _run(tmp_path))
    _write(trackers, ROWS, tmp_path)
    scalars = read.tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["success_rate"] == [(1, 0.25), (2, 0.5)]
    assert scalars["wall_s"] == [(1, 3.0), (2, 6.0)]  # the held-out row's own wall_s does not overwrite it
    assert scalars["heldout/wall_s"] == [(2, 7.5)] and scalars["heldout/mean"] == [(2, pytest.approx(0.3))]
    assert scalars["summary/learner_updates"] == [(2, 2.0)]
    assert "gate/tau" not in scalars and "note" not in scalars and "summary/groups_by_family" not in scalars
    events = read.tensorboard(tmp_path / "tensorboard")
    assert events.Images("images/profile")[0].encoded_image_string == read.png(3, 2)
    assert (events.Images("images/profile")[0].width, events.Images("images/profile")[0].height) == (3, 2)
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "lr = 0.001" in config
    assert json.loads((tmp_path / IDS_FILE).read_text()) == {"tensorboard": str(tmp_path / "tensorboard")}


def test_tensorboard_resume_drops_the_steps_after_the_checkpoint(tmp_path):
    first = Trackers.open(["tensorboard"], {}, _run(tmp_path))
    for step in (1, 2, 3):
        first.log_row({"iteration": step, "success_rate": step / 8})
    first.close(False)  # interrupted after update 3; its checkpoint holds update 2
    resumed = Trackers.open(["tensorboard"], {}, _run(tmp_path, resume_step=2))
    for step in (3, 4):
        resumed.log_row({"iteration": step, "success_rate": step})
    resumed.close(True)
    assert read.tensorboard_scalars(tmp_path / "tensorboard")["success_rate"] == [(1, 0.125), (2, 0.25), (3, 3.0), (4, 4.0)]


def test_wandb_offline_run_holds_rows_config_summary_and_image(tmp_path):
    trackers = Trackers.open(["wandb"], {"wandb": {"mode": "offline", "tags": ["t"]}}, _run(tmp_path))
    _write(trackers, ROWS, tmp_path)
    [path] = read.wandb_files(tmp_path)
    records = read.wandb_records(path)
    run = read.wandb_run(records)
    assert run["run_id"] == json.loads((tmp_path / IDS_FILE).read_text())["wandb"]
    assert run["project"] == "rollcut" and run["display_name"] == tmp_path.name
    assert run["config"]["update"]["learner"]["lr"] == 0.001
    history = read.wandb_history(records)
    rows = [{k: v for k, v in h.items() if not k.startswith("_")} for h in history]
    assert rows[0] == {"iteration": 1, "wall_s": 3, "success_rate": 0.25, "learner/approx_kl": 0.01}
    assert rows[2] == {"iteration": 2, "heldout/wall_s": 7.5, "heldout/env_steps": 640, "heldout/eval_s": 1.5,
                       "heldout/mean": 0.3, "heldout/seen": 0.4}
    assert rows[3]["iteration"] == 2 and rows[3]["images/profile._type"] == "image-file"
    assert (path.parent / "files" / rows[3]["images/profile.path"]).read_bytes() == read.png(3, 2)
    assert read.wandb_summary(records)["summary/learner_updates"] == 2
    assert any(r["type"] == "exit" and r["exit"].get("exit_code", 0) == 0 for r in records)


def test_wandb_resume_appends_to_the_same_run(tmp_path):
    first = Trackers.open(["wandb"], {"wandb": {"mode": "offline"}}, _run(tmp_path))
    first.log_row({"iteration": 1, "success_rate": 0.1})
    first.close(False)
    resumed = Trackers.open(["wandb"], {"wandb": {"mode": "offline"}}, _run(tmp_path, resume_step=1))
    resumed.log_row({"iteration": 2, "success_rate": 0.2})
    resumed.close(True)
    files = read.wandb_files(tmp_path)
    assert len(files) == 2  # offline: a second folder of the same run (`wandb sync` uploads one run)
    runs = [read.wandb_run(read.wandb_records(f)) for f in files]
    assert runs[0]["run_id"] == runs[1]["run_id"] and runs[1]["resume"] is True
    steps = [h["iteration"] for f in files for h in read.wandb_history(read.wandb_records(f))]
    assert steps == [1, 2]


def test_mlflow_store_in_the_run_folder_holds_params_metrics_and_artifacts(tmp_path):
    trackers = Trackers.open(["mlflow"], {}, _run(tmp_path))
    _write(trackers, ROWS, tmp_path)
    run_id = json.loads((tmp_path / IDS_FILE).read_text())["mlflow"]
    client = read.mlflow_client(tmp_path)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == tmp_path.name
    assert run.data.params["learner.lr"] == "0.001" and run.data.params["run.trackers"] == "[]"
    assert read.mlflow_history(client, run_id, "success_rate") == [(1, 0.25), (2, 0.5)]
    assert read.mlflow_history(client, run_id, "heldout/mean") == [(2, 0.3)]
    assert read.mlflow_history(client, run_id, "summary/learner_updates") == [(2, 2.0)]
    assert [a.path for a in client.list_artifacts(run_id, "images")] == ["images/profile.png"]


def test_mlflow_resume_appends_and_tags_changed_params(tmp_path):
    first = Trackers.open(["mlflow"], {}, _run(tmp_path))
    first.log_row({"iteration": 1, "success_rate": 0.1})
    first.close(False)
    run_id = json.loads((tmp_path / IDS_FILE).read_text())["mlflow"]
    import msgspec

    cfg = load_config(None, ["learner.lr=0.002"])
    resumed = Trackers.open(["mlflow"], {}, TrackerRun(tmp_path, tmp_path.name, msgspec.to_builtins(cfg), dump_toml(cfg),
                                                         resume_step=1))
    resumed.log_row({"iteration": 2, "success_rate": 0.2})
    resumed.close(True)
    client = read.mlflow_client(tmp_path)
    assert json.loads((tmp_path / IDS_FILE).read_text())["mlflow"] == run_id
    assert read.mlflow_history(client, run_id, "success_rate") == [(1, 0.1), (2, 0.2)]
    run = client.get_run(run_id)
    assert run.data.params["learner.lr"] == "0.001" and run.data.tags["resumed.learner.lr"] == "0.002"
    assert run.info.status == "FINISHED"


def test_finish_run_reports_only_what_this_job_wrote(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"learner_updates": 9}))
    trackers = Trackers.open(["tensorboard"], {}, _run(tmp_path))
    trackers.log_row({"iteration": 1, "success_rate": 0.5})
    import time

    finish_run(trackers, tmp_path, since=time.time() + 60, ok=False)  # an older summary: not this job's
    assert "summary/learner_updates" not in read.tensorboard_scalars(tmp_path / "tensorboard")


def test_a_tracker_that_fails_is_dropped_and_the_others_go_on(tmp_path):
    class Broken:
        run_id = "b"

        def log_row(self, values, step):
            raise OSError("disk full")

        def close(self, ok):
            self.closed = ok

    broken = Broken()
    trackers = Trackers({"broken": broken, "tensorboard": Trackers.open(["tensorboard"], {}, _run(tmp_path))._trackers["tensorboard"]})
    trackers.log_row({"iteration": 1, "success_rate": 0.5})
    trackers.log_row({"iteration": 2, "success_rate": 0.75})
    assert trackers.names == ["tensorboard"] and broken.closed is False
    trackers.close(True)
    assert read.tensorboard_scalars(tmp_path / "tensorboard")["success_rate"] == [(1, 0.5), (2, 0.75)]


def test_config_problems_are_listed_at_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without the wandb package looks like
    problems = tracker_problems(
        ["wandb", "tensorboard", "tensorboard", "nope", "tests.plugin_trackers:NeedsAbsentPackage"],
        {"tensorboard": {"log_dir": 3}, "mlflow": {}, "tests.plugin_trackers:NeedsAbsentPackage": {"level": "high"}},
    )
    assert problems[0] == "run.trackers: 'tensorboard' is named more than once"
    assert "run.trackers: 'wandb' needs the wandb package: pip install 'rollcut[wandb]'" in problems
    assert any(p.startswith("trackers.tensorboard.log_dir: Expected `str`") for p in problems)
    assert any(p.startswith("run.trackers: unknown trackers 'nope'") for p in problems)
    assert any("rollcut_test_absent_package package: pip install 'rollcut[absent-extra]'" in p for p in problems)
    assert any(p.startswith("trackers.tests.plugin_trackers:NeedsAbsentPackage.level") for p in problems)
    assert "trackers.mlflow: options for a tracker that run.trackers does not name" in problems
    assert len(problems) == 7


def test_wandb_mode_is_offline_unless_logged_in_or_told():
    assert wandb_mode("auto", {}, logged_in=False) == "offline"
    assert wandb_mode("auto", {}, logged_in=True) == "online"
    assert wandb_mode("auto", {"WANDB_MODE": "offline"}, logged_in=True) == "offline"
    assert wandb_mode("online", {"WANDB_MODE": "offline"}, logged_in=False) == "online"
    assert tracker_problems(["wandb"], {"wandb": {"mode": "cloud"}}) == [
        "trackers.wandb: mode must be one of auto, offline, online, not 'cloud'"
    ]
