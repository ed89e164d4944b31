"""What the run builds from its config: here, how many decoding workers `policy.workers` resolves to."""

from pipeline.config import load_config
from pipeline.run import build
from pipeline.run.build import decoding_workers


def test_a_count_is_taken_as_it_is():
    assert decoding_workers(load_config(None, ["policy.workers=3"])) == 3


def test_auto_counts_the_cores_this_process_may_use(monkeypatch):
    cfg = load_config(None, ["policy.workers=auto"])
    for cores, workers in ((1, 1), (2, 2), (16, 8)):
        monkeypatch.setattr(build, "available_cores", lambda cores=cores: cores)
        assert decoding_workers(cfg) == workers


def test_auto_is_one_worker_for_a_backend_that_batches_the_whole_run_itself(monkeypatch):
    monkeypatch.setattr(build, "available_cores", lambda: 16)
    cfg = load_config(None, ["policy.workers=auto", "policy.backend=vllm", "policy.model=/nonexistent"])
    assert decoding_workers(cfg) == 1  # one vLLM engine; a second on the same device would fight it for memory
    assert decoding_workers(load_config(None, ["policy.workers=2", "policy.backend=vllm"])) == 2  # asked for: kept
