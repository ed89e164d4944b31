"""The one way a part of the run starts in another process: the gate stage, the learner stage and each
decoding worker go through `launch`, and every child runs `main` here.

The parent writes what the child needs (`ChildSpec`: its role, the run's config as msgspec encodes it, the
addresses, the run's secret, the learner's trainer state) to a private file (0600 in a 0700 folder, read and
deleted by the child: the secret never appears on a command line, and nothing is unpickled), starts
`python -m pipeline.run.launch ROLE FILE` (the role shows in `ps`) and hands back a `Child`:

* ready: the child says so with `StageReady` on the socket its role reports on; the parent's reader of that
  socket calls `Child.ready.set()`, and `launch` returns to its `nursery.start` only then;
* stop: cancelling `launch` stops the child (SIGTERM, which cancels its role so that its cleanup runs; SIGKILL
  after 5 s) and waits for it;
* death: a child that exits by itself sets `Child.ended` and fails the run with `ChildExited` naming it;
* orphans: a child watches its parent and exits when the parent is gone.

That is the local launcher (`LocalLauncher`). A parent that starts a set of children goes through a
`Launcher`, so that the same code starts them as Ray actors (`ray_launch.RayLauncher`, `placement.launcher =
"ray"`): `place` starts the children's hosts and learns who they are (nothing for child processes; a Ray
actor's node and the public key of the CURVE key pair it made), and the `Placed` it gives says where the
parent binds, how its zmq context is sealed and what each spec carries, and launches each child.

The child's role (`ROLES`) names the function that serves it; the roles live with their parent side
(`stage_children.py`: gate and learner, `decoding_worker.py`: a decoding worker) and build what they serve with
`build.py`, from the config they were given.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import msgspec
import trio

from pipeline.config import RunConfig, TransportSection
from pipeline.curve import CurveKeys
from pipeline.sealing import new_secret
from pipeline.stage import StageFailed

ROOT = Path(__file__).resolve().parents[2]
ROLES = {
    "gate": "pipeline.run.stage_children:serve_gate",
    "learner": "pipeline.run.stage_children:serve_learner",
    "custom": "pipeline.run.stage_children:serve_custom",
    "decoder": "pipeline.run.decoding_worker:serve_decoder",
}
"""A child's role -> the `async def serve(spec, keys)` that runs it (imported in the child only; `keys`: the
child's own CURVE key pair on Ray, None for a child process, whose sockets the run's secret seals)."""


class ChildSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a launched child is given (msgpack, in its private file)."""

    role: str
    config: RunConfig
    addresses: TransportSection
    """The phase's addresses (`placement.addresses`); a decoder's are `inbox` / `outbox`."""
    parent: int
    """The parent's pid: the child exits when it is gone."""
    sys_path: list[str]
    """The parent's import path: plugins named `module:Class` import in the child too."""
    secret: bytes = b""
    """The run's secret (`pipeline.transport`): the child's sockets are sealed with it."""
    run_dir: str = ""
    index: int = 0
    """Which decoding worker this is; a custom stage's entry in `stages`."""
    inbox: str = ""
    outbox: str = ""
    """A decoding worker's request PULL and reply PUSH addresses."""
    version: int = 0
    trainer_state: bytes = b""
    """The learner's trainer state (warm start or checkpoint) packed by `pipeline.tensors`, and its version."""
    capture_state: bool = False
    """The learner puts its trainer state in every report (the run writes checkpoints)."""
    gate_counters: dict[str, Any] | None = None
    """A resumed run's gate counters."""
    server_key: bytes = b""
    """On Ray: the CURVE public key of the parent's sockets this child connects to (its frames are not sealed
    with a secret there: CURVE admits only the keys the parent was told); the sockets this child binds admit
    that key alone."""
    bind_host: str = ""
    """On Ray: the host a stage child binds its own socket on, at an ephemeral port (`tcp://<bind_host>:0`,
    the real address said in its `StageReady`); "" binds the address it was given."""
    max_frame: int = 0
    """A decoding worker's inbox: the largest frame it takes, sized from the weights (0: `MESSAGE_FRAME_BYTES`)."""


def child_spec(role: str, cfg: RunConfig, addresses: TransportSection, secret: bytes = b"", **fields: Any) -> ChildSpec:
    """The spec of a child of this process (its parent's pid and import path filled in)."""
    return ChildSpec(role=role, config=cfg, addresses=addresses, parent=os.getpid(), sys_path=list(sys.path),
                     secret=secret, **fields)


class ChildExited(StageFailed):
    """A launched child exited while the run needed it."""


@dataclass(eq=False)
class Child:
    """A launched child as the parent holds it."""

    stage: str
    """The stage it serves, for the profile and for failures ("gate", "learner", "policy")."""
    what: str
    """How a failure names it ("its process", "decoding worker 2")."""
    ready: trio.Event = field(default_factory=trio.Event)
    ended: trio.Event = field(default_factory=trio.Event)
    pid: int | None = None
    """Its process id when it runs on this machine (the profile reads its CPU), else None."""
    node: str = ""
    """The Ray node it was placed on ("" for a child process of this one)."""
    endpoints: dict[str, str] = field(default_factory=dict)
    """What it bound, by address name, as it said in its `StageReady` (a stage child on Ray)."""
    may_return: bool = False
    """A clean exit is its end, not a failure (a custom stage's process, once its stage read the events to their end)."""


async def launch(child: Child, spec: ChildSpec, *, env: dict[str, str] | None = None,
                 task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Run `spec` in a child process until cancelled; started once `child.ready` is set."""
    with tempfile.TemporaryDirectory(prefix=f"rollcut-{spec.role}-") as folder:  # 0700: the spec stays private
        path = Path(folder) / "spec.msgpack"
        write_private(path, msgspec.msgpack.encode(spec))
        command = [sys.executable, "-m", "pipeline.run.launch", spec.role, str(path)]
        environment = os.environ | (env or {}) | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        async with trio.open_nursery() as nursery:
            # the parent's working directory: the config's relative paths (run folder, cache) mean the same there
            process = await nursery.start(partial(trio.run_process, command, check=False, env=environment))
            child.pid = process.pid
            nursery.start_soon(_fail_on_exit, child, process)
            await child.ready.wait()
            task_status.started()


async def _fail_on_exit(child: Child, process: trio.Process) -> None:
    await process.wait()
    child.ended.set()
    if child.may_return and process.returncode == 0:
        return
    raise ChildExited(child.stage, f"{child.what} exited with code {process.returncode} (its stderr is above)")


class Placed(Protocol):
    """A set of children placed by a `Launcher`, not yet launched."""

    def context_options(self) -> dict[str, Any]:
        """`open_context` keywords for the parent's sockets that these children reach."""
        ...

    def bind_address(self, name: str) -> str:
        """Where the parent binds its socket `name` (read the real address back from the socket)."""
        ...

    def reachable(self, bound: str) -> str:
        """The address the children are given for a socket the parent bound at `bound`."""
        ...

    def sealed(self, spec: ChildSpec) -> ChildSpec:
        """`spec` with what its child needs to reach the parent's sockets (the secret, or a server key)."""
        ...

    def peer_key(self, child: Child) -> bytes | None:
        """The CURVE public key the sockets `child` binds are served with (None: no key pair of its own)."""
        ...

    async def launch(self, child: Child, spec: ChildSpec, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run `spec` until cancelled (started once `child.ready` is set); fails with `ChildExited`."""
        ...


class Launcher(Protocol):
    """How a parent starts its children: `LocalLauncher` or `ray_launch.RayLauncher` (`build.launcher`)."""

    def place(self, role: str, children: Sequence[Child], *,
              env: dict[str, str] | None = None) -> contextlib.AbstractAsyncContextManager[Placed]:
        """Place `children`, all of `role` (each one's host exists inside the block and is gone after it)."""
        ...


class LocalLauncher:
    """Children as processes of this one, talking over ipc:// files in a private folder, sealed by a secret."""

    def place(self, role: str, children: Sequence[Child], *,
              env: dict[str, str] | None = None) -> contextlib.AbstractAsyncContextManager[Placed]:
        return self._place(env)

    @contextlib.asynccontextmanager
    async def _place(self, env: dict[str, str] | None) -> AsyncIterator[Placed]:
        with tempfile.TemporaryDirectory(prefix="rollcut-children-") as folder:  # 0700: only this user reaches it
            yield _LocalPlaced(folder, new_secret(), env)


@dataclass(frozen=True)
class _LocalPlaced:
    folder: str
    secret: bytes
    env: dict[str, str] | None

    def context_options(self) -> dict[str, Any]:
        return {"secret": self.secret}

    def bind_address(self, name: str) -> str:
        return f"ipc://{self.folder}/{name}"

    def reachable(self, bound: str) -> str:
        return bound

    def sealed(self, spec: ChildSpec) -> ChildSpec:
        return msgspec.structs.replace(spec, secret=self.secret)

    def peer_key(self, child: Child) -> bytes | None:
        return None

    async def launch(self, child: Child, spec: ChildSpec, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await launch(child, spec, env=self.env, task_status=task_status)


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read, from the start (it holds the run's secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


# --------------------------------------------------------------------------------------------------
# The child's side


async def watch_parent(parent: int, cancel: trio.CancelScope) -> None:
    """Polls: the death of another process has no event to wait on here."""
    while os.getppid() == parent:  # noqa: ASYNC110
        await trio.sleep(1.0)
    cancel.cancel()


async def serve_role(spec: ChildSpec, keys: CurveKeys | None) -> None:
    """Serve `spec.role` in this process (a child process, or a Ray actor's thread) until it returns."""
    module, _, name = ROLES[spec.role].partition(":")
    await getattr(importlib.import_module(module), name)(spec, keys)


async def stop_on_sigterm(cancel: trio.CancelScope) -> None:
    """The parent's stop (SIGTERM) cancels the role, so that its `finally` blocks run: a decoder closes its
    backend (vllm: the engine and its processes). The parent's SIGKILL 5 s later stays the backstop."""
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            cancel.cancel()
            return


async def _serve(spec: ChildSpec) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_parent, spec.parent, nursery.cancel_scope)
        nursery.start_soon(stop_on_sigterm, nursery.cancel_scope)
        await serve_role(spec, None)
        nursery.cancel_scope.cancel()


def lower_priority(spec: ChildSpec) -> None:
    """A decoding worker adds `policy.worker_nice` to its niceness (the rest run as the run does)."""
    if spec.role == "decoder" and spec.config.policy.worker_nice:
        os.nice(spec.config.policy.worker_nice)


def main() -> None:
    """`python -m pipeline.run.launch ROLE SPEC_FILE`: started by `launch`, not by hand."""
    from pipeline.rundir import configure_logging

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    path = Path(sys.argv[2])
    spec = msgspec.msgpack.decode(path.read_bytes(), type=ChildSpec)  # typed decoding: nothing here runs code
    path.unlink()  # it holds the run's secret
    lower_priority(spec)
    sys.path[:] = [*spec.sys_path, *(p for p in sys.path if p not in spec.sys_path)]
    configure_logging(None)
    trio.run(_serve, spec)


if __name__ == "__main__":
    main()
