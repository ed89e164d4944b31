"""`eval.reuse_before`: the before measure is keyed by the served weights and what the measure reads, stored once,
read back by the next run from the same warm start, and never by a run whose weights or tasks differ."""

import json

import pytest
import torch

from pipeline.config import load_config
from pipeline.progress import Progress
from pipeline.run import before_cache
from pipeline.run.checks import load
from pipeline.run.job import run_job
from tests.test_run_integration import _tiny


class _Model(torch.nn.Module):
    def __init__(self, fill: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((3,), fill))
        self.h = torch.nn.Parameter(torch.full((2,), fill, dtype=torch.bfloat16))


def test_the_key_follows_the_weights_and_the_measure_not_the_decoding_processes():
    base = load_config(None, [])
    weights = before_cache.weights_digest(_Model(1.0))
    assert weights == before_cache.weights_digest(_Model(1.0))
    assert weights != before_cache.weights_digest(_Model(2.0))
    key = before_cache.before_key(base, weights)
    assert before_cache.before_key(load_config(None, ["policy.workers=3", 'policy.cache_dir="elsewhere"']), weights) == key
    for change in ("eval.tasks=7", 'eval.range="test"', "policy.temperature=0.3", "env.max_steps=9"):
        assert before_cache.before_key(load_config(None, [change]), weights) != key, change
    assert before_cache.before_key(base, before_cache.weights_digest(_Model(2.0))) != key


def test_a_stored_measure_reads_back_and_a_broken_file_is_measured_again(tmp_path):
    path = tmp_path / "heldout-k.json"
    assert before_cache.load_before(path) is None
    before_cache.store_before(path, {"heldout_seen": [[1, "f", True, 3]]}, run_name="a")
    assert before_cache.load_before(path) == {"heldout_seen": [[1, "f", True, 3]]}
    assert json.loads(path.read_text())["measured_by"] == "a"
    path.write_text("{not json")
    assert before_cache.load_before(path) is None


@pytest.mark.slow
async def test_the_second_run_from_the_same_warm_start_reads_the_first_ones_before_measure(tmp_path):
    runs = []
    for name in ("first", "second"):
        cfg = load(None, _tiny(tmp_path, "eval.reuse_before=true", f'run.name="{name}"', "gate.enabled=false"))
        runs.append((await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))).summary)
    first, second = runs
    assert (first["heldout_before_reused"], second["heldout_before_reused"]) == (False, True)
    assert second["heldout_before"] == first["heldout_before"]
    assert len(list((tmp_path / "cache").glob("heldout-*.json"))) == 1
    cfg = load(None, _tiny(tmp_path, "eval.reuse_before=true", 'run.name="third"', "gate.enabled=false", "eval.tasks=3"))
    third = (await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))).summary
    assert third["heldout_before_reused"] is False  # other tasks: measured, and stored beside the first
    assert len(list((tmp_path / "cache").glob("heldout-*.json"))) == 2
