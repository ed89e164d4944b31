"""`policy.workers = "auto"` on Ray: the decoders the cluster's resources hold (no cluster needed)."""

import pytest

ray = pytest.importorskip("ray")

from pipeline.config import load_config  # noqa: E402
from pipeline.run import ray_launch  # noqa: E402


@pytest.fixture
def cluster_of(monkeypatch):
    def set_resources(**resources: float) -> None:
        monkeypatch.setattr(ray_launch.ray, "cluster_resources", lambda: dict(resources))

    return set_resources


def _cfg(*overrides: str):
    return load_config(None, ['placement.launcher="ray"', "policy.workers=auto", *overrides])


def test_one_cpu_is_left_to_the_coordinator(cluster_of):
    cluster_of(CPU=16.0)
    assert ray_launch.auto_decoders(_cfg()) == 15


def test_the_gate_and_learner_actors_are_taken_out_in_processes_mode(cluster_of):
    cluster_of(CPU=16.0, head=1.0)
    assert ray_launch.auto_decoders(_cfg('transport.mode="processes"')) == 13
    assert ray_launch.auto_decoders(_cfg('transport.mode="processes"', "placement.stages={num_cpus = 0, resources = {head = 0.5}}")) == 15


def test_the_scarcest_resource_of_a_decoder_decides(cluster_of):
    cluster_of(CPU=64.0, GPU=4.0, decoder_node=3.0)
    assert ray_launch.auto_decoders(_cfg("placement.decoder={num_cpus = 2, num_gpus = 1}")) == 4
    assert ray_launch.auto_decoders(_cfg("placement.decoder={num_cpus = 1, resources = {decoder_node = 1}}")) == 3
    cluster_of(CPU=1.0)
    assert ray_launch.auto_decoders(_cfg()) == 1  # at least one
