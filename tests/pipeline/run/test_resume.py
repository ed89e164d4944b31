"""Checkpoint mechanics: atomic writes keep the old file on failure, metrics rows past the checkpoint are
dropped, and config changes are sorted into blocking / training / harmless."""

import json

import pytest
import torch

from pipeline.config import load_config
from pipeline.run.resume import (
    Checkpointer,
    atomic_write,
    atomic_write_text,
    config_changes,
    load_state,
    trim_metrics,
)


def test_atomic_write_keeps_the_previous_file_when_writing_fails(tmp_path):
    path = tmp_path / "state"
    atomic_write_text(path, "old")

    def fail(f):
        f.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_write(path, fail)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state"]  # no temporary left behind


def test_checkpointer_writes_every_n_updates_and_only_new_versions(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    ckpt = Checkpointer(tmp_path, every=2, job={"warm_start_s": 1.0})
    assert ckpt.write() is None and load_state(tmp_path) is None
    ckpt.capture({"version": 1})
    assert ckpt.write() == 1
    assert load_state(tmp_path) == {"version": 1, "format": 1, "job": {"warm_start_s": 1.0}}
    mtime = ckpt.path.stat().st_mtime_ns
    assert ckpt.write() == 1 and ckpt.path.stat().st_mtime_ns == mtime  # same version: not rewritten


async def test_the_published_weights_are_kept_every_n_updates_beside_the_checkpoint(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    ckpt = Checkpointer(tmp_path, every=1, keep_weights_every=2)
    model, average = {"w": torch.zeros(2)}, {"w": torch.ones(2)}
    for version in (1, 2, 3, 4):
        ckpt.capture({"version": version, "trainer": {"model": model, "average": average if version == 4 else None}})
        await ckpt.after_update(version)
    kept = sorted(p.name for p in (tmp_path / "checkpoints").glob("policy-v*.pt"))
    assert kept == ["policy-v0002.pt", "policy-v0004.pt"]
    assert torch.equal(torch.load(ckpt.weights_path(2), weights_only=True)["w"], torch.zeros(2))  # the learner's weights
    assert torch.equal(torch.load(ckpt.weights_path(4), weights_only=True)["w"], torch.ones(2))  # the average it serves


def test_trim_metrics_drops_rows_after_the_checkpoint_and_a_torn_last_line(tmp_path):
    rows = [json.dumps({"iteration": i}) for i in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + '\n{"iteration": 4, "tr')
    assert trim_metrics(tmp_path, 2) == 2
    assert [json.loads(x)["iteration"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert trim_metrics(tmp_path, 2) == 0


def test_config_changes_are_sorted_by_what_they_break():
    saved = load_config(None, [])
    new = load_config(None, ["run.updates=20", "learner.lr=0.001", "policy.options={layers = 2}", "run.name=x"])
    blocking, training, harmless = config_changes(saved, new)
    assert blocking == ["policy.options: {} -> {'layers': 2}"]
    assert training == ["learner.lr: 0.0005 -> 0.001"]
    assert harmless == ["run.updates: 10 -> 20"]
