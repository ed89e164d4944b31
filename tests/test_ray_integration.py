"""`placement.launcher = "ray"` on a simulated cluster (`ray.cluster_utils.Cluster`, one for the module): a
head with a custom resource and no CPU for actors, and two worker nodes of one CPU each, all on this
machine's IP (so placement is checked by node id). This process is the coordinator, joined to the cluster.

* the decoders land one per worker node, the coordinator is on the head; every endpoint is an ephemeral tcp
  port bound by the coordinator; a stranger's connection without the keys is refused and counted;
* a run reaches its updates with the counts of a local run, and leaves no actor or placement group;
* a decoder killed mid-run stops the run with one message naming it and its node, the checkpoint of the
  last update is kept, and the resumed run reaches the configured updates with every update counted once;
* with `transport.mode = "processes"` the gate and learner stages (and a custom stage with `process = true`)
  are actors on the head (its custom resource), each binding its own socket on an ephemeral port with its own
  keys; a stranger's connection to the gate's steps socket is refused and counted, the custom stage reads
  every event, and the run reaches its updates with the same counts; a
  killed learner actor stops the run naming it and its node, and the run resumes exactly;
* with `[placement.coordinator]` the whole job runs in a coordinator actor on the head: it reaches its
  updates, the driver's interrupt stops it with a checkpoint and the run resumes exactly in a new coordinator
  actor; a killed coordinator fails the run naming it and its node, and its decoders end with it.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import time

import pytest
import trio
import zmq

from pipeline.progress import Progress
from pipeline.run import build, placement
from pipeline.run.checks import load
from pipeline.run.job import RunFailed, RunInterrupted, run_job
from stages.policy.base import AgentContext
from tests.test_resume_integration import _metrics
from tests.test_run_integration import _tiny

ray = pytest.importorskip("ray")
ray_launch = pytest.importorskip("pipeline.run.ray_launch")
ray_coordinator = pytest.importorskip("pipeline.run.ray_coordinator")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ON_RAY = ['placement.launcher="ray"', "policy.workers=2", "placement.ready_timeout_s=300", "gate.k=4"]
KILLED_RUN_UPDATES = 8
"""Room for the kill to land: the fault stage kills at weight version 1 from its own event loop, and on a busy
CI machine the learner once published versions 2-4 from groups already in flight before the kill took effect
(the run then failed at its last update, leaving nothing to resume)."""
SMALL_STORE = 80 * 1024 * 1024
"""Object store per fake node: nothing rollcut sends goes through it."""


@pytest.fixture(scope="module")
def cluster():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    fake = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "resources": {"head": 1},
                                                         "object_store_memory": SMALL_STORE})
    workers = [fake.add_node(num_cpus=1, object_store_memory=SMALL_STORE) for _ in range(2)]
    ray.init(address=fake.address)
    try:
        yield fake.head_node.node_id, sorted(node.node_id for node in workers)
    finally:
        ray.shutdown()
        fake.shutdown()


def _leftovers() -> tuple[list[str], list[str]]:
    """Named rollcut actors still alive, and placement groups not removed."""
    actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("rollcut-")]
    groups = [g for g, info in ray.util.placement_group_table().items() if info["state"] != "REMOVED"]
    return actors, groups


async def _until(condition, seconds: float) -> None:
    """What another process does (a handshake, Ray's bookkeeping) has no event here: look every 50 ms."""
    with trio.move_on_after(seconds):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.05)


async def _nothing_left() -> tuple[list[str], list[str]]:
    """Leftovers once Ray has recorded the kills and removals it was sent (asynchronous: up to 30 s)."""
    await _until(lambda: _leftovers() == ([], []), 30)
    return _leftovers()


async def test_decoders_spread_over_the_worker_nodes_and_a_stranger_is_refused(cluster, tmp_path):
    head, workers = cluster
    cfg = load(None, _tiny(tmp_path, *ON_RAY, "pretrain.enabled=false"))
    suite = build.suite(cfg)
    task = list(suite.tasks("train"))[0]
    env = suite.make()
    obs = env.reset(task)
    context = AgentContext(task.description, obs.text, obs.admissible, ())
    env.close()
    policy = build.policy(cfg, suite, warm_start=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        assert sorted(child.node for child in policy.children) == workers  # one per worker node, none on the head
        assert ray.get_runtime_context().get_node_id() == head  # the coordinator
        assert policy.address.startswith(f"tcp://{ray.util.get_node_ip_address()}:") and not policy.address.endswith(":0")
        for named in ray.util.list_named_actors(all_namespaces=True):  # answered while `run` holds its thread
            actor = ray.get_actor(named["name"], namespace=named["namespace"])
            assert await trio.to_thread.run_sync(lambda a=actor: ray.get(a.health.remote(), timeout=60))
        result = await policy.act(context, number=0)
        assert result.token_ids and result.policy_version == policy.version

        stranger = zmq.Context()
        push = stranger.socket(zmq.PUSH)
        push.connect(policy.address)  # no CURVE keys: the handshake fails
        await _until(lambda: policy.dropped_frames().get("decoders", {}).get("handshake_failed", 0) >= 1, 60)
        push.close(linger=0)
        stranger.term()
        assert policy.dropped_frames()["decoders"]["handshake_failed"] >= 1
        assert (await policy.act(context, number=1)).token_ids  # the decoders still answer
        nursery.cancel_scope.cancel()
        stopping = time.perf_counter()
    print(f"pool stop: {time.perf_counter() - stopping:.2f} s")  # shown, not judged (the guard below is the
    # threaded actor: an asyncio one could not be asked to stop, and each stop waited out the 5 s grace)
    assert await _nothing_left() == ([], [])


def test_the_actors_are_threaded_so_stop_and_health_reach_a_running_child():
    """An `async def` method would make Ray run the actor as an asyncio actor: `run` would block its loop."""
    for actor in (ray_launch.ChildActor, ray_coordinator.Coordinator):
        assert not [name for name, member in vars(actor).items() if inspect.iscoroutinefunction(member)], actor


async def test_a_run_on_ray_reaches_its_updates_and_leaves_nothing_behind(cluster, tmp_path):
    cfg = load(None, _tiny(tmp_path, *ON_RAY, "run.updates=3"))
    result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    summary, rows = result.summary, _metrics(result.run_dir)
    assert summary["learner_updates"] == 3 and summary["stop_reason"] == "updates"
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert summary["groups_trained"] == rows[-1]["groups_trained"] >= 3 * 2  # B = 2, drop_zero_variance off
    assert summary["dropped_frames_total"] == 0
    assert summary["env_steps"] > 0 and summary["cut_groups_reaching_learner"] == 0
    # trajectories cancelled as the phase ends are not failures (their abandon notice once raised PolicyStopped
    # into the cancellation when the pool's inboxes had closed first)
    assert summary["trajectories_failed"] == 0
    assert await _nothing_left() == ([], [])


async def test_a_killed_decoder_stops_the_run_by_name_and_the_run_resumes_exactly(cluster, tmp_path):
    sets = _tiny(tmp_path, *ON_RAY, f"run.updates={KILLED_RUN_UPDATES}", "run.name=killed")
    cfg = load(None, [*sets, 'stages=[{target = "tests.plugin_ray:KillDecoder", options = {after = 1}}]'])
    with pytest.raises(RunFailed) as failed:
        await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    failed_at = time.time()
    message = str(failed.value)
    run_dir = tmp_path / "runs" / "killed"
    print(f"kill to failure: {failed_at - (run_dir / 'killed-decoder').stat().st_mtime:.2f} s\n{message}")
    assert "decoding worker 0 (Ray actor rollcut-decoder-0-" in message
    assert f" on node {ray.util.get_node_ip_address()} (" in message
    assert "checkpoint at update" in message and "run.py resume" in message
    assert await _nothing_left() == ([], [])
    stopped_at = int(re.search(r"checkpoint at update (\d+)", message).group(1))
    assert 1 <= stopped_at < KILLED_RUN_UPDATES

    resumed = await run_job(load(run_dir / "config.toml", []), progress=Progress(KILLED_RUN_UPDATES, enabled=False), resume_dir=run_dir)
    summary, rows = resumed.summary, _metrics(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, KILLED_RUN_UPDATES + 1))  # appended after the checkpoint, none twice
    assert summary["learner_updates"] == KILLED_RUN_UPDATES and summary["stop_reason"] == "updates"
    assert summary["groups_trained"] == rows[-1]["groups_trained"]
    assert await _nothing_left() == ([], [])


STAGES_ON_HEAD = ['transport.mode="processes"', "placement.stages={num_cpus = 0, resources = {head = 0.5}}"]


async def test_gate_learner_and_custom_actors_on_the_head_refuse_a_stranger_and_the_run_reaches_its_updates(cluster, tmp_path, monkeypatch):
    head, workers = cluster
    seen: dict[str, tuple[str, str]] = {}
    strangers: list[zmq.Socket] = []
    stranger = zmq.Context()

    def spy(handle_class, name):
        original = handle_class.run

        async def run(self, ctx, *, task_status=trio.TASK_STATUS_IGNORED):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(lambda task_status: original(self, ctx, task_status=task_status))
                seen[name] = (self.child.node, address)
                if name == "gate":  # no CURVE keys: the gate actor's handshake refuses it
                    push = stranger.socket(zmq.PUSH)
                    push.connect(address)
                    strangers.append(push)
                task_status.started(address)

        monkeypatch.setattr(handle_class, "run", run)

    spy(placement.GateChild, "gate")
    spy(placement.LearnerChild, "learner")
    spy(placement.CustomChild, "custom")
    three_on_head = ['transport.mode="processes"', "placement.stages={num_cpus = 0, resources = {head = 0.25}}",
                     'stages=[{target = "tests.plugin_stages:SeenToFile", process = true}]']
    cfg = load(None, _tiny(tmp_path, *ON_RAY, *three_on_head, "run.updates=3"))
    try:
        result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    finally:
        for push in strangers:
            push.close(linger=0)
        stranger.term()
    summary, rows = result.summary, _metrics(result.run_dir)
    ip = ray.util.get_node_ip_address()
    assert {name: node for name, (node, _) in seen.items()} == {"gate": head, "learner": head, "custom": head}
    for name in ("gate", "learner"):  # each bound by the actor itself, on its node, at an ephemeral port
        assert seen[name][1].startswith(f"tcp://{ip}:") and not seen[name][1].endswith(":0")
    custom = json.loads((result.run_dir / "seen.json").read_text())  # the custom stage's actor read every event
    assert custom["versions"] == [1, 2, 3] and custom["pid"] != os.getpid()
    assert summary["learner_updates"] == 3 and summary["stop_reason"] == "updates"
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert summary["groups_trained"] == rows[-1]["groups_trained"] >= 3 * 2
    assert summary["cut_groups_reaching_learner"] == 0 and summary["trajectories_failed"] == 0
    assert summary["dropped_frames"]["steps"].get("handshake_failed", 0) >= 1  # the stranger, counted by the gate
    assert summary["dropped_frames_total"] == sum(summary["dropped_frames"]["steps"].values())  # and nothing else
    assert await _nothing_left() == ([], [])


async def test_a_killed_learner_actor_stops_the_run_by_name_and_the_run_resumes_exactly(cluster, tmp_path):
    sets = _tiny(tmp_path, *ON_RAY, *STAGES_ON_HEAD, f"run.updates={KILLED_RUN_UPDATES}", "run.name=learner-killed")
    cfg = load(None, [*sets, 'stages=[{target = "tests.plugin_ray:KillDecoder", options = {after = 1, actor = "learner"}}]'])
    with pytest.raises(RunFailed) as failed:
        await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    message = str(failed.value)
    print(message)
    assert "stage 'learner': its process (Ray actor rollcut-learner-" in message
    assert f" on node {ray.util.get_node_ip_address()} (" in message and "died" in message
    assert await _nothing_left() == ([], [])
    stopped_at = int(re.search(r"checkpoint at update (\d+)", message).group(1))
    assert 1 <= stopped_at < KILLED_RUN_UPDATES
    run_dir = tmp_path / "runs" / "learner-killed"
    resumed = await run_job(load(run_dir / "config.toml", []), progress=Progress(KILLED_RUN_UPDATES, enabled=False), resume_dir=run_dir)
    summary, rows = resumed.summary, _metrics(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, KILLED_RUN_UPDATES + 1))  # appended after the checkpoint, none twice
    assert summary["learner_updates"] == KILLED_RUN_UPDATES and summary["groups_trained"] == rows[-1]["groups_trained"]
    assert await _nothing_left() == ([], [])


COORDINATOR_ON_HEAD = "placement.coordinator={num_cpus = 0, resources = {head = 0.25}}"


def _rows_written(run_dir) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and bool(metrics.read_text().strip())


async def test_the_coordinator_actor_runs_the_job_stops_on_the_drivers_interrupt_and_resumes_exactly(cluster, tmp_path):
    head, workers = cluster
    auto = [*ON_RAY, "policy.workers=auto", COORDINATOR_ON_HEAD, "run.updates=3"]
    done = await ray_coordinator.run_job_on_ray(load(None, _tiny(tmp_path, *auto)))
    assert done.node == head  # the job ran in the actor on the head, not in this process
    assert done.summary["decoding_workers"] == 2  # "auto": the cluster's two CPUs, the coordinator reserving none
    rows = _metrics(done.run_dir)
    assert done.summary["learner_updates"] == 3 and [r["iteration"] for r in rows] == [1, 2, 3]
    assert done.summary["groups_trained"] == rows[-1]["groups_trained"] >= 3 * 2 and done.summary["trajectories_failed"] == 0
    assert done.summary_md.startswith(f"# rollcut run `{done.run_dir.name}`")  # read on the coordinator's node
    assert f"| groups_trained | {done.summary['groups_trained']} |" in done.summary_md
    assert await _nothing_left() == ([], [])

    run_dir = tmp_path / "runs" / "stopped"
    cfg = load(None, _tiny(tmp_path, *ON_RAY, COORDINATOR_ON_HEAD, "run.updates=8", "run.name=stopped"))
    stop = trio.Event()

    async def interrupt() -> None:  # the driver's Ctrl-C, once an update is in
        await _until(lambda: _rows_written(run_dir), 600)
        stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(interrupt)
        with pytest.raises(RunInterrupted) as stopped:
            await ray_coordinator.run_job_on_ray(cfg, stop=stop)
    assert stopped.value.run_dir == run_dir and 1 <= stopped.value.version < 8
    assert await _nothing_left() == ([], [])
    resumed = await ray_coordinator.run_job_on_ray(load(run_dir / "config.toml", []), resume_dir=run_dir)
    rows = _metrics(run_dir)
    assert [r["iteration"] for r in rows] == list(range(1, 9))  # appended after the checkpoint, none twice
    assert resumed.summary["learner_updates"] == 8 and resumed.summary["groups_trained"] == rows[-1]["groups_trained"]
    assert await _nothing_left() == ([], [])


async def test_a_killed_coordinator_actor_fails_the_run_by_name_and_leaves_nothing(cluster, tmp_path):
    run_dir = tmp_path / "runs" / "coordinator-killed"
    cfg = load(None, _tiny(tmp_path, *ON_RAY, COORDINATOR_ON_HEAD, "run.updates=50", "run.name=coordinator-killed"))

    async def kill() -> None:
        await _until(lambda: _rows_written(run_dir), 600)
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("rollcut-coordinator-")]
        ray.kill(ray.get_actor(names[0], namespace="rollcut"), no_restart=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kill)
        with pytest.raises(RunFailed) as failed:
            await ray_coordinator.run_job_on_ray(cfg)
    message = str(failed.value)
    print(message)
    assert "the coordinator (Ray actor rollcut-coordinator-" in message and "died" in message
    assert f" on node {ray.util.get_node_ip_address()} (" in message and "run.py resume" in message
    assert await _nothing_left() == ([], [])  # its decoders and their placement group ended with it
