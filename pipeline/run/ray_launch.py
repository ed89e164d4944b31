"""Children as Ray actors (`placement.launcher = "ray"`): the decoding workers spread over a Ray cluster, and
in processes mode the gate and learner stages (role "stage" here, `[placement.stages]`, packed).

This process stays the coordinator: admission, the staleness budget, the allocator, the rollout stage, cut
routing, checkpoints and metrics keep running in it, on the node it was started on. Ray places the
decoders, the scaled unit; the data between them and the coordinator never goes through Ray's object
store: it is the same ZeroMQ + msgspec traffic as between local processes. A stage actor binds its own
socket on its node (`ChildSpec.bind_host`) under its own key pair, admitting only the coordinator's key, and
says the address in its `StageReady`; the coordinator connects to it expecting that actor's key (`peer_key`).

Placing a set of children (`RayLauncher.place`), in two phases:

1. **Place and identify.** One placement group reserves a bundle per child (`[placement.decoder]`: CPUs,
   GPUs, custom node resources; `decoder_strategy`: SPREAD over the nodes by default), and one threaded
   actor (`ChildActor`) starts in each bundle. Each actor makes a CURVE key pair in its own process and
   answers `identity()`: its node, the node's IP, its pid and its *public* key. A cluster that cannot hold
   the bundles fails the run within `placement.ready_timeout_s`, naming what was asked and what is free.
2. **Address book.** The coordinator makes its own key pair, binds its sockets on `tcp://<listen>:0`
   (ephemeral ports, read back from the sockets), admits exactly the actors' public keys, and launches each
   actor's `run(spec)` with the advertised endpoints and its own public key (`ChildSpec.server_key`). A
   socket that anything else connects to refuses the handshake and counts it (`dropped_frames`:
   `handshake_failed`, `unauthenticated`). Secret keys never leave their process; Ray carries only
   addresses, public keys and the msgpack-encoded spec. The run's frame-sealing secret is not used here.

Running, stopping, failing (fail-stop, `max_restarts = 0`): `run` holds one actor thread with `trio.run`
inside; `stop()` reaches that loop through `trio.from_thread` from another thread of the actor, and is
followed by `ray.kill` after `STOP_GRACE_S`. The coordinator waits on every actor's `run()` and pings
`health()` every `HEALTH_EVERY_S`: an actor or node that dies, returns, or stops answering fails the run with
`launch.ChildExited` naming the decoder and its node (the job then writes the checkpoint of the last
update; `python run.py resume RUN_DIR` continues from it). The placement group and every actor are removed
when the pool's block ends, however it ends; Ray also ends actors whose owner (this process) is gone.

Ray's own control plane deserialises its messages with pickle: run a Ray cluster on a trusted network
(Ray's security guidance). What rollcut sends between processes is msgpack, typed on receipt; the one
pickled object rollcut reads is Ray's: a failed actor's exception (`RayTaskError.cause`, of which
`_fail_on_exit` reads the first line), acceptable under that trusted-cluster model (docs/ray.md, "Security").
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import ray
import structlog
import trio
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from pipeline.config import PlacementSection, RoleResources, RunConfig
from pipeline.curve import new_key_pair, own_keys
from pipeline.stage import StageFailed

from .failure import RunRefused
from .launch import ROOT, Child, ChildExited, ChildSpec, Placed, serve_role

log = structlog.get_logger(__name__)

STOP_GRACE_S = 5.0
"""How long a stopped actor gets to leave its loop before `ray.kill` (a child process gets the same)."""
HEALTH_EVERY_S = 5.0
HEALTH_TIMEOUT_S = 30.0
GROUP_PREFIX_ENV = "ROLLCUT_GROUP_PREFIX"
"""Set in a coordinator actor's environment: the names of the placement groups it makes start with it, so that
the driver can remove them if the actor dies (a group outlives the actor that made it, not its job)."""
"""An actor that does not answer a health ping for this long fails the run (a hung node, a partition)."""


async def resolved(ref: Any) -> Any:
    """The value of a Ray object ref, awaited without holding a thread (raises what `ray.get` would)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: Any) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the run ended while Ray was still working
            token.run_sync_soon(done.set)

    future = ref.future()
    future.add_done_callback(wake)
    await done.wait()
    return future.result()


@contextlib.asynccontextmanager
async def joined(placement: PlacementSection) -> AsyncIterator[None]:
    """This process joined to the Ray cluster of `placement.address` for the block (left as it was when the
    caller had already joined one: a driver script, a test's cluster)."""
    if ray.is_initialized():
        yield
        return
    owner = _RayOwner(init_options(placement))
    owner.start()
    await trio.to_thread.run_sync(owner.ready.wait)
    if isinstance(owner.error, ConnectionError) and placement.address:
        raise RunRefused(no_cluster_message(placement.address, owner.error)) from owner.error
    if owner.error is not None:
        raise owner.error
    log.info("ray.joined", address=placement.address or "(started for this run)", nodes=len(ray.nodes()),
             resources=ray.cluster_resources())
    try:
        yield
    finally:
        owner.release.set()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(owner.join)


@contextlib.contextmanager
def _quiet_sigterm_warning() -> Iterator[None]:
    """Leave out Ray's "SIGTERM handler is not set" warning, which `ray.init` off the main thread always logs."""
    worker_log = logging.getLogger("ray._private.worker")

    def keep(record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()

    worker_log.addFilter(keep)
    try:
        yield
    finally:
        worker_log.removeFilter(keep)


def no_cluster_message(address: str, error: BaseException) -> str:
    """What a run that found no Ray cluster at `placement.address` says (one line: the two ways on)."""
    return (f"no Ray cluster at placement.address = {address!r} ({first_line(error)}): start one first with "
            "`ray start --head` (docs/ray.md), or use `--ray \"\"` to start Ray for this run on this machine")


class _RayOwner(threading.Thread):
    """The thread that joins Ray (`ray.init`), stays until the run releases it, then leaves (`ray.shutdown`).

    A Ray started here (`placement.address = ""`) runs its head processes with PR_SET_PDEATHSIG, which Linux
    ties to the *thread* that forked them: started from a Trio worker thread, which exits after 10 idle
    seconds, the head would be killed mid-run (GCS gone, every process of the cluster terminating)."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(name="rollcut-ray", daemon=True)
        self.options = options
        self.ready, self.release = threading.Event(), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with _quiet_sigterm_warning():  # rollcut handles SIGTERM itself (run.py's signal watcher)
                ray.init(**self.options)
        except BaseException as exc:  # handed to the coordinator, which raises it (a thread has no one to raise to)
            self.error = exc
            return
        finally:
            self.ready.set()
        self.release.wait()
        ray.shutdown()


def init_options(placement: PlacementSection) -> dict[str, Any]:
    """`ray.init` keywords for `placement` (usage statistics off unless the environment says otherwise)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    options: dict[str, Any] = {"address": placement.address or None, "namespace": placement.namespace,
                               "runtime_env": {"env_vars": actor_env()}, "log_to_driver": True}
    if not placement.address:
        options["include_dashboard"] = False  # a Ray of this run only: nothing to browse
    return options


def actor_env() -> dict[str, str]:
    """The environment an actor needs to import rollcut (and plugins named `module:Class`) as this process does."""
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys([str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))}


class ChildActor:
    """One child hosted by a Ray actor (threaded: `run` holds one thread, `stop` and `health` use others).

    No method may be `async def`: Ray would make it an asyncio actor, whose one event loop `run` would block
    (then neither `stop` nor `health` could be answered while it runs)."""

    def __init__(self) -> None:
        self._public, self._secret = new_key_pair()  # made here; the secret key never leaves this process
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._stopping = False

    def identity(self) -> tuple[str, str, int, bytes]:
        """(node id, node IP, pid, CURVE public key)."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid(), self._public

    def run(self, spec: bytes) -> None:
        decoded = msgspec.msgpack.decode(spec, type=ChildSpec)  # typed decoding: nothing here runs code
        sys.path[:] = [*decoded.sys_path, *(p for p in sys.path if p not in decoded.sys_path)]
        admits = frozenset({decoded.server_key}) if decoded.server_key else frozenset()  # what a stage child binds
        trio.run(_serve_in_actor, self, decoded, own_keys(self._public, self._secret, admits=admits, server=decoded.server_key))

    def started(self, token: trio.lowlevel.TrioToken, scope: trio.CancelScope) -> None:
        """Called on the actor's Trio thread as `run` begins: where `stop` reaches it."""
        self._token, self._scope = token, scope
        if self._stopping:
            scope.cancel()

    def stop(self) -> None:
        self._stopping = True
        token, scope = self._token, self._scope
        if token is not None and scope is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(scope.cancel, trio_token=token)

    def health(self) -> bool:
        return True


async def _serve_in_actor(actor: ChildActor, spec: ChildSpec, keys: Any) -> None:
    with trio.CancelScope() as scope:
        actor.started(trio.lowlevel.current_trio_token(), scope)
        await serve_role(spec, keys)


@dataclass(frozen=True, slots=True)
class ActorIdentity:
    node_id: str
    ip: str
    pid: int
    public: bytes
    name: str

    def where(self) -> str:
        return f"Ray actor {self.name} on node {self.ip} ({self.node_id[:12]})"


class RayLauncher:
    """Implements `launch.Launcher`: each child a Ray actor in a bundle of one placement group."""

    def __init__(self, placement: PlacementSection) -> None:
        self._placement = placement

    def place(self, role: str, children: Sequence[Child], *,
              env: dict[str, str] | None = None) -> contextlib.AbstractAsyncContextManager[Placed]:
        return self._place(role, children, env or {})

    @contextlib.asynccontextmanager
    async def _place(self, role: str, children: Sequence[Child], env: dict[str, str]) -> AsyncIterator[Placed]:
        p = self._placement
        resources, strategy = {"decoder": (p.decoder, p.decoder_strategy), "stage": (p.stages, "PACK")}[role]
        bundle = bundle_of(resources)
        group = placement_group([bundle] * len(children), strategy=strategy, name=group_name(role))
        actors: list[Any] = []
        try:
            await reserve(group, bundle, role, len(children), p.ready_timeout_s)
            tag = secrets.token_hex(3)
            names = [f"rollcut-{role}-{index}-{tag}" if role == "decoder" else f"rollcut-{child.stage}-{tag}"
                     for index, child in enumerate(children)]
            actor_class = ray.remote(ChildActor)
            for index, name in enumerate(names):
                actors.append(actor_class.options(
                    name=name, namespace=p.namespace, max_concurrency=4, max_restarts=0, **resources.options(),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index),
                    runtime_env={"env_vars": actor_env() | env}).remote())
            found = [await resolved(actor.identity.remote()) for actor in actors]
            identities = [ActorIdentity(*fields, name=name) for fields, name in zip(found, names, strict=True)]
            here = ray.get_runtime_context().get_node_id()
            for child, identity in zip(children, identities, strict=True):
                child.node = identity.node_id
                if identity.node_id == here:  # its CPU can be read from /proc here (the profile's `policy` row)
                    child.pid = identity.pid
            log.info("ray.placed", children=len(children), nodes=sorted({i.ip for i in identities}),
                     actors=[i.name for i in identities])
            public, secret = new_key_pair()
            host = p.advertise or ray.util.get_node_ip_address()
            yield _RayPlaced(dict(zip(children, zip(actors, identities, strict=True), strict=True)), public, secret,
                             listen=p.listen or host, advertise=host)
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)  # a no-op for an actor that has ended
            remove_placement_group(group)


def group_name(role: str) -> str:
    """A placement group's name: `<prefix>-<role>-<tag>` (prefix: the coordinator actor's, else "rollcut")."""
    return f"{os.environ.get(GROUP_PREFIX_ENV, 'rollcut')}-{role}-{secrets.token_hex(3)}"


def remove_groups(prefix: str) -> None:
    """Remove every placement group whose name starts with `prefix-` that is not removed yet."""
    for info in ray.util.placement_group_table().values():
        if str(info.get("name", "")).startswith(f"{prefix}-") and info.get("state") != "REMOVED":
            with contextlib.suppress(Exception):  # removed meanwhile
                remove_placement_group(ray.util.get_placement_group(info["name"]))


def bundle_of(resources: RoleResources) -> dict[str, float]:
    """What one actor of a role reserves, as a placement group bundle."""
    return {key: amount for key, amount in {"CPU": resources.num_cpus, "GPU": resources.num_gpus, **resources.resources}.items()
            if amount}


def auto_decoders(cfg: RunConfig) -> int:
    """`policy.workers = "auto"` on Ray (joined): as many `[placement.decoder]` bundles as the cluster holds once
    the coordinator's share (its `[placement.coordinator]` bundle when it is an actor, else one CPU) and, in
    processes mode, the gate's and the learner's `[placement.stages]` bundles are taken out; at least 1."""
    p = cfg.placement
    free = dict(ray.cluster_resources())
    taken = [bundle_of(p.coordinator) if p.coordinator is not None else {"CPU": 1.0}]
    if cfg.transport.mode == "processes":
        taken += [bundle_of(p.stages)] * 2
    for bundle in taken:
        for key, amount in bundle.items():
            free[key] = free.get(key, 0.0) - amount
    fits = min(int(free.get(key, 0.0) // amount) for key, amount in bundle_of(cfg.placement.decoder).items())
    log.info("ray.auto_workers", workers=max(1, fits), cluster=ray.cluster_resources())
    return max(1, fits)


async def reserve(group: Any, bundle: dict[str, float], role: str, count: int, timeout_s: float) -> None:
    with trio.move_on_after(timeout_s):
        await resolved(group.ready())
        return
    remedy = {"decoder": "lower policy.workers or [placement.decoder]", "stage": "lower [placement.stages]",
              "coordinator": "lower [placement.coordinator]"}[role]
    raise StageFailed("policy" if role == "decoder" else "placement",
                      f"Ray could not reserve {count} {role} bundle(s) of {bundle} in {timeout_s:g} s "
                      f"(placement.ready_timeout_s); the cluster has {ray.cluster_resources()}, free now "
                      f"{ray.available_resources()}: {remedy}, or add nodes")


@dataclass(frozen=True)
class _RayPlaced:
    actors: dict[Child, tuple[Any, ActorIdentity]]
    public: bytes
    secret: bytes
    listen: str
    advertise: str

    def context_options(self) -> dict[str, Any]:
        # the actors, and this process itself (its own stages subscribe to the events it publishes over tcp)
        admitted = frozenset(identity.public for _, identity in self.actors.values()) | {self.public}
        return {"keys": own_keys(self.public, self.secret, admits=admitted)}

    def bind_address(self, name: str) -> str:
        return f"tcp://{self.listen}:0"

    def reachable(self, bound: str) -> str:
        return f"tcp://{self.advertise}:{bound.rsplit(':', 1)[1]}"

    def sealed(self, spec: ChildSpec) -> ChildSpec:
        return msgspec.structs.replace(spec, server_key=self.public, secret=b"")

    def peer_key(self, child: Child) -> bytes | None:
        return self.actors[child][1].public

    async def launch(self, child: Child, spec: ChildSpec, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        actor, identity = self.actors[child]
        spec = msgspec.structs.replace(spec, bind_host=identity.ip)  # what it binds, it binds on its node
        run = actor.run.remote(msgspec.msgpack.encode(spec))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_fail_on_exit, child, run, identity, nursery.cancel_scope)
                nursery.start_soon(_ping, child, actor, identity)
                await child.ready.wait()
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                actor.stop.remote()
                with trio.move_on_after(STOP_GRACE_S), contextlib.suppress(Exception):
                    await resolved(run)
                ray.kill(actor, no_restart=True)


async def _fail_on_exit(child: Child, run: Any, identity: ActorIdentity, scope: trio.CancelScope) -> None:
    """Fail the run when the actor's `run` ends; a child that may return ends its launch (`scope`) instead."""
    try:
        await resolved(run)
        what = "returned"
        if child.may_return:
            child.ended.set()
            scope.cancel()
            return
    except ray.exceptions.RayActorError as exc:
        what = f"died: {first_line(exc)}"
    except ray.exceptions.RayTaskError as exc:
        what = f"failed: {first_line(exc.cause if exc.cause is not None else exc)}"
    child.ended.set()
    raise ChildExited(child.stage, f"{child.what} ({identity.where()}) {what}")


async def _ping(child: Child, actor: Any, identity: ActorIdentity) -> None:
    while True:
        await trio.sleep(HEALTH_EVERY_S)
        with trio.move_on_after(HEALTH_TIMEOUT_S) as waited:
            with contextlib.suppress(ray.exceptions.RayError):  # a dead actor: `_fail_on_exit` names it
                await resolved(actor.health.remote())
        if waited.cancelled_caught:
            child.ended.set()
            raise ChildExited(child.stage, f"{child.what} ({identity.where()}) did not answer a health ping "
                                           f"in {HEALTH_TIMEOUT_S:g} s")


def first_line(exc: BaseException) -> str:
    """`Type: first line` of what failed (inside nurseries' exception groups, the first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0].rstrip('.') if text else ''}"
