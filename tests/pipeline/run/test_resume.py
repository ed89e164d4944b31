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
    assert load_state(tmp_path) == {"version": 1, "format": 2, "job": {"warm_start_s": 1.0}}
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


def test_weights_due_when_ctrl_c_cut_the_update_short_are_kept_at_the_end(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    ckpt = Checkpointer(tmp_path, every=1, keep_weights_every=2)
    assert ckpt.keep_due() is None  # nothing captured
    ckpt.capture({"version": 1, "trainer": {"model": {"w": torch.zeros(2)}, "average": None}})
    assert ckpt.keep_due() is None  # not due
    ckpt.capture({"version": 2, "trainer": {"model": {"w": torch.ones(2)}, "average": None}})  # then Ctrl-C: no after_update
    assert ckpt.keep_due() == ckpt.weights_path(2)
    assert torch.equal(torch.load(ckpt.weights_path(2), weights_only=True)["w"], torch.ones(2))
    mtime = ckpt.weights_path(2).stat().st_mtime_ns
    assert ckpt.keep_due() is None and ckpt.weights_path(2).stat().st_mtime_ns == mtime  # kept already: not rewritten


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
    assert blocking == ["policy.options.layers: None -> 2"]
    assert training == ["learner.lr: 0.0005 -> 0.001"]
    assert harmless == ["run.updates: 10 -> 20"]


def test_a_backends_decoding_threads_may_change_on_resume_but_not_its_other_options():
    saved = load_config(None, ["policy.options={layers = 2, threads = 1}", 'env.options={families = ["a"]}'])
    placed = load_config(None, ["policy.options={layers = 2, threads = 2}", 'env.options={families = ["a"]}'])
    assert config_changes(saved, placed) == ([], [], ["policy.options.threads: 1 -> 2"])
    reshaped = load_config(None, ["policy.options={layers = 3, threads = 2}", 'env.options={families = ["a", "b"]}'])
    blocking, training, harmless = config_changes(saved, reshaped)
    assert blocking == ["env.options.families: ['a'] -> ['a', 'b']", "policy.options.layers: 2 -> 3"]
    assert training == [] and harmless == ["policy.options.threads: 1 -> 2"]


def _trained_state() -> dict:
    """What a checkpoint holds, with the awkward parts: an Adam state keyed by int, betas tuples, tensors and the
    Python / torch global RNG states."""
    import random

    from pipeline.run.resume import rng_state

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return {"version": 3, "trainer": {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                      "rng": random.Random(7).getstate(), "average": None},
            "rng": rng_state(), "grpo": {"tally": {"groups_received": 5, "wall": 1.5}, "kinds_by_family": {"a": {"cut": 2}}},
            "policy": None, "allocator": {"order": [3, 1, 2], "epoch": 1}}


def test_a_checkpoint_round_trips_and_holds_no_pickle(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    state = _trained_state()
    ckpt = Checkpointer(tmp_path, every=1)
    ckpt.capture(state)
    ckpt.write()
    assert b"\x80\x02" not in ckpt.path.read_bytes()[:2] and not ckpt.path.read_bytes().startswith(b"PK")  # no pickle, no zip
    loaded = load_state(tmp_path)
    assert loaded["trainer"]["rng"] == state["trainer"]["rng"] and isinstance(loaded["trainer"]["rng"], tuple)
    assert loaded["rng"]["python"] == state["rng"]["python"] and torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])
    assert loaded["grpo"] == state["grpo"] and loaded["allocator"] == state["allocator"]
    opt = loaded["trainer"]["optimizer"]
    assert opt["param_groups"] == state["trainer"]["optimizer"]["param_groups"]  # int parameter ids, betas tuple
    for key, value in state["trainer"]["optimizer"]["state"][0].items():
        assert torch.equal(opt["state"][0][key], value)
    fresh = torch.nn.Linear(3, 2)
    torch.optim.Adam(fresh.parameters(), lr=1e-3).load_state_dict(opt)
    fresh.load_state_dict(loaded["trainer"]["model"])
    import random

    random.Random().setstate(loaded["trainer"]["rng"])  # a tuple again, as Random needs


class _Planted:
    """A pickle that runs code when loaded: it creates `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_is_refused_and_runs_nothing(tmp_path):
    from pipeline.run.failure import RunRefused

    (tmp_path / "checkpoints").mkdir()
    marker = tmp_path / "ran"
    torch.save({"format": 2, "state": _Planted(marker)}, tmp_path / "checkpoints" / "state.pt")
    with pytest.raises(RunRefused) as refused:
        load_state(tmp_path)
    assert not marker.exists()
    message = str(refused.value)
    assert "\n" not in message and str(tmp_path / "checkpoints" / "state.pt") in message and "nothing in it was run" in message


@pytest.mark.parametrize("content", [b"this is not a checkpoint\n", b"", None])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path, content):
    from pipeline.run.failure import RunRefused

    (tmp_path / "checkpoints").mkdir()
    path = tmp_path / "checkpoints" / "state.pt"
    if content is None:  # a real checkpoint cut short
        ckpt = Checkpointer(tmp_path, every=1)
        ckpt.capture(_trained_state())
        ckpt.write()
        content = path.read_bytes()[: path.stat().st_size // 2]
    path.write_bytes(content)
    with pytest.raises(RunRefused) as refused:
        load_state(tmp_path)
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)
