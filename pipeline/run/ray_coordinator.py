"""The coordinator as a Ray actor (`placement.launcher = "ray"` with `[placement.coordinator]` set).

`python run.py` then places one actor, `rollcut-coordinator-<tag>`, in a placement group of one
`[placement.coordinator]` bundle (e.g. `{num_cpus = 1, resources = {head = 1}}`: a node started with that
custom resource), and the whole job runs inside it: the warm start, the held-out measures, admission, the
staleness budget, the allocator, the rollout stage, cut routing, custom stages, checkpoints, metrics and the
run folder. From there the job places its decoders (and, in processes mode, its gate and learner actors)
exactly as a coordinator in the driver would (`ray_launch.py`): they are the coordinator actor's children,
and Ray ends them with it.

The process you started (the driver) only waits: on the actor's `run()`, and on a health ping every
`HEALTH_EVERY_S`. Ctrl-C / SIGTERM there reaches the job through `stop()` (the same graceful stop, with a
checkpoint); the job's per-update lines reach your terminal through Ray's log forwarding. The driver gets
back a typed, msgpack-encoded `JobEnded` (what ended the job, the run folder, the summary). One path is
Ray's, not rollcut's: an exception that escapes the actor's `run()` reaches the driver as a `RayTaskError`
whose `cause` Ray has unpickled (as it unpickles everything on its control plane); the driver reads only its
first line. That is acceptable under Ray's trusted-cluster model, which a run on Ray assumes anyway (only
trusted machines can reach the cluster: docs/ray.md, "Security"); the run's own frames stay msgpack. A
coordinator that dies (its process or its node) fails the run with one line naming it and its node, and where
its run folder is.

The run folder is written on the coordinator's node, at the path the driver would use: run the driver on
that node (pin the coordinator to it with a custom resource) or put `run.out` on a filesystem both see, so
that `python run.py resume RUN_DIR --ray ADDRESS` finds it. The actor starts in the driver's working
directory (the same path on every node, as for every actor: docs/ray.md).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
import ray
import structlog
import trio
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from pipeline.config import RunConfig
from pipeline.progress import Progress
from pipeline.stage import StageFailed

from .failure import RunRefused
from .job import RunFailed, RunInterrupted, run_job
from .ray_launch import (
    GROUP_PREFIX_ENV,
    HEALTH_EVERY_S,
    HEALTH_TIMEOUT_S,
    STOP_GRACE_S,
    actor_env,
    bundle_of,
    first_line,
    joined,
    remove_groups,
    reserve,
    resolved,
)

log = structlog.get_logger(__name__)


class JobEnded(msgspec.Struct, frozen=True):
    """What the coordinator actor returns to the driver (msgpack; nothing the driver decodes runs code)."""

    ended: Literal["done", "interrupted", "failed", "refused"]
    node: str
    """The node id the job ran on."""
    run_dir: str
    message: str = ""
    """RunFailed's / RunInterrupted's / RunRefused's one line."""
    version: int | None = None
    """The update the checkpoint holds (interrupted)."""
    summary: dict[str, Any] = {}
    summary_md: str = ""


@dataclass(frozen=True)
class RemoteJob:
    """A job that ran in the coordinator actor: what `run_job`'s `JobResult` gives, read from `JobEnded`."""

    run_dir: Path
    summary: dict[str, Any]
    summary_md: str
    node: str
    """The node id of the coordinator actor (where `run_dir` is)."""


class Coordinator:
    """The job in a threaded Ray actor: `run` holds one thread with `trio.run` inside; `stop` and `health` use
    others. No method may be `async def` (Ray would make it an asyncio actor, whose loop `run` would block)."""

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._stopping = False

    def identity(self) -> tuple[str, str, int]:
        """(node id, node IP, pid)."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def run(self, config: bytes, resume_dir: str, cwd: str) -> bytes:
        try:
            os.chdir(cwd)  # relative paths of the config (run.out, policy.cache_dir...) mean what they mean to the driver
        except OSError as exc:
            raise RuntimeError(f"this node has no folder {cwd} (the driver's working directory): install rollcut at "
                               f"the same path on every node (docs/ray.md)") from exc
        cfg = msgspec.msgpack.decode(config, type=RunConfig)  # typed decoding: nothing here runs code
        return msgspec.msgpack.encode(trio.run(_job, self, cfg, Path(resume_dir) if resume_dir else None))

    def started(self, token: trio.lowlevel.TrioToken, stop: trio.Event) -> None:
        """Called on the actor's Trio thread as the job begins: where `stop` reaches it."""
        self._token, self._stop = token, stop
        if self._stopping:
            stop.set()

    def stop(self) -> None:
        """The driver's Ctrl-C: the job stops as it would on a signal (checkpoint, then `interrupted`)."""
        self._stopping = True
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)

    def health(self) -> bool:
        return True


async def _job(actor: Coordinator, cfg: RunConfig, resume_dir: Path | None) -> JobEnded:
    """The job in the actor's Trio run (a module function: an `async def` method would make the actor asyncio)."""
    stop = trio.Event()
    actor.started(trio.lowlevel.current_trio_token(), stop)
    node = ray.get_runtime_context().get_node_id()
    try:
        result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=cfg.run.progress), resume_dir=resume_dir,
                               stop=stop)
    except RunInterrupted as exc:
        return JobEnded("interrupted", node, str(exc.run_dir), str(exc), version=exc.version)
    except RunFailed as exc:
        return JobEnded("failed", node, str(resume_dir or ""), str(exc))
    except RunRefused as exc:  # e.g. a resume whose checkpoint cannot be read
        return JobEnded("refused", node, str(resume_dir or ""), str(exc))
    return JobEnded("done", node, str(result.run_dir), summary=result.summary, summary_md=result.summary_md)


async def run_job_on_ray(cfg: RunConfig, *, resume_dir: Path | None = None, stop: trio.Event | None = None) -> RemoteJob:
    """`run_job` in a coordinator actor; raises what `run_job` raises (`RunInterrupted`, `RunFailed`, `RunRefused`)."""
    p = cfg.placement
    assert p.coordinator is not None, "run_job_on_ray needs [placement.coordinator]"
    stop = stop if stop is not None else trio.Event()
    async with joined(p):
        bundle = bundle_of(p.coordinator)
        group = placement_group([bundle], strategy="PACK")
        actor = None
        try:
            try:
                await reserve(group, bundle, "coordinator", 1, p.ready_timeout_s)
            except StageFailed as exc:
                raise RunFailed(str(exc)) from None
            name = f"rollcut-coordinator-{secrets.token_hex(3)}"
            actor = ray.remote(Coordinator).options(
                name=name, namespace=p.namespace, max_concurrency=4, max_restarts=0, **p.coordinator.options(),
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=0),
                runtime_env={"env_vars": actor_env() | {GROUP_PREFIX_ENV: name}}).remote()
            node, ip, _ = await resolved(actor.identity.remote())
            where = f"the coordinator (Ray actor {name} on node {ip} ({node[:12]}))"
            log.info("ray.coordinator_placed", actor=name, node=node, ip=ip)
            cwd = os.getcwd()
            resume = str(resume_dir if resume_dir.is_absolute() else Path(cwd, resume_dir)) if resume_dir else ""
            run = actor.run.remote(msgspec.msgpack.encode(cfg), resume, cwd)
            ended = await _wait(actor, run, stop, where)
        finally:
            if actor is not None:
                ray.kill(actor, no_restart=True)  # a no-op once it returned; its child actors end with it
                remove_groups(name)  # their placement groups do not (a dead coordinator could not remove them)
            remove_placement_group(group)
    if ended.ended == "interrupted":
        raise RunInterrupted(Path(ended.run_dir), ended.version)
    if ended.ended == "failed":
        raise RunFailed(ended.message)
    if ended.ended == "refused":
        raise RunRefused(ended.message)
    return RemoteJob(Path(ended.run_dir), ended.summary, ended.summary_md, ended.node)


async def _wait(actor: Any, run: Any, stop: trio.Event, where: str) -> JobEnded:
    """The actor's `JobEnded`, passing the driver's stop on; a death or a silence fails the run, by name (raised
    here, outside the nursery, so the caller sees `RunFailed` itself)."""
    failure: list[str] = []
    raw = b""

    async def forward_stop(scope: trio.CancelScope) -> None:
        await stop.wait()
        actor.stop.remote()
        await trio.sleep(STOP_GRACE_S * 12)  # the job writes its checkpoint, then returns: this is cancelled first
        failure.append(f"{where} did not stop within {STOP_GRACE_S * 12:g} s of the interrupt")
        scope.cancel()

    async def ping(scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep(HEALTH_EVERY_S)
            with trio.move_on_after(HEALTH_TIMEOUT_S) as waited:
                with contextlib.suppress(ray.exceptions.RayError):  # a dead actor: the wait on `run` names it
                    await resolved(actor.health.remote())
            if waited.cancelled_caught:
                failure.append(f"{where} did not answer a health ping in {HEALTH_TIMEOUT_S:g} s")
                scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(forward_stop, nursery.cancel_scope)
        nursery.start_soon(ping, nursery.cancel_scope)
        try:
            raw = await resolved(run)
        except ray.exceptions.RayActorError as exc:
            failure.append(f"{where} died: {first_line(exc)}; its checkpoint of the last update is in its run folder on "
                           "that node: `python run.py resume RUN_DIR --ray ADDRESS`")
        except ray.exceptions.RayTaskError as exc:
            failure.append(f"{where} failed: {first_line(exc.cause if exc.cause is not None else exc)}")
        nursery.cancel_scope.cancel()
    if failure:
        raise RunFailed(failure[0])
    return msgspec.msgpack.decode(raw, type=JobEnded)
