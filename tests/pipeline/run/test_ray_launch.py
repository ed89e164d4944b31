"""`policy.workers = "auto"` on Ray: the decoders the cluster's resources hold (no cluster needed); and a Ray
the run starts for itself outlives the thread that started it."""

import os
import threading
from pathlib import Path

import pytest
import trio

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


def _children(*names: str) -> list[int]:
    """Pids of this process's children whose command is one of `names`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm, _, rest = (entry / "stat").read_text().partition(") ")
            except OSError:  # gone meanwhile
                continue
            if comm.partition(" (")[2] in names and int(rest.split()[1]) == os.getpid():
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """Running, not killed (a killed child of this process stays a zombie until reaped)."""
    try:
        return (Path("/proc", str(pid), "stat")).read_text().partition(") ")[2][0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.ray
async def test_a_ray_started_for_the_run_outlives_the_thread_that_started_it(monkeypatch):
    """Ray's head processes die with the *thread* that forked them (PR_SET_PDEATHSIG): started from a Trio
    worker thread, which leaves after 10 idle seconds, the head would be killed mid-run."""
    if ray.is_initialized():
        pytest.skip("this process has joined a Ray cluster already")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setattr(trio._core._thread_cache, "IDLE_TIMEOUT", 0.01)  # idle worker threads leave at once
    async with ray_launch.joined(load_config(None, ['placement.launcher="ray"']).placement):
        head = _children("gcs_server", "raylet")
        assert len(head) == 2
        with trio.move_on_after(10):  # an OS thread's exit has no event to wait on: look every 50 ms
            while any(t.name.startswith("Trio thread") for t in threading.enumerate()):  # noqa: ASYNC110
                await trio.sleep(0.05)
        assert all(_alive(pid) for pid in head)
    assert not ray.is_initialized()


def test_no_cluster_at_the_address_is_refused_in_one_line(monkeypatch):
    """`ray.init` finding no cluster (what it raises for `--ray auto` with no `ray start`) is `RunRefused`: one line
    naming `ray start --head` and `--ray ""`, not Ray's ConnectionError inside an exception group."""
    from pipeline.config import PlacementSection
    from pipeline.run.failure import RunRefused

    def no_cluster(**_: object) -> None:
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to by setting "
                              "`--address` flag or `RAY_ADDRESS` environment variable.")

    monkeypatch.setattr(ray_launch.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_launch.ray, "init", no_cluster)

    async def join() -> None:
        async with ray_launch.joined(PlacementSection(launcher="ray", address="auto")):
            raise AssertionError("joined without a cluster")

    with pytest.raises(RunRefused) as refused:
        trio.run(join)
    message = str(refused.value)
    assert "\n" not in message and "'auto'" in message
    assert "`ray start --head`" in message and '`--ray ""`' in message and "Could not find any running Ray instance" in message
