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
