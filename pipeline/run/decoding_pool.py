"""Decoding in worker processes: `policy.workers` copies of the policy, each its own server over ZeroMQ.

The GIL lets one process decode on one core at a time; a pool of worker processes uses every core. Each
worker is a child started by `launch.py` (role "decoder") that builds the same backend from the run's config
(`build.backend`), gets the main process's current weights first, and serves `ActRequest`s from its
own PULL socket; all workers push `ActReply`s to one PULL socket here. The pool is itself a `Policy`, so the rollout stage, evaluation and
the learner do not know whether decoding is local or not:

* `act()` sends the context as text to the worker with the fewest outstanding requests (the worker
  builds the prompt, decodes, parses) and waits for its reply. The request's sampling number is assigned
  here in call order, so results do not depend on which worker answers. A cancelled caller sends
  `AbandonRequest`; the worker drops the request if its batch has not started.
* `load_weights()` serialises the state once (`pipeline.tensors`, no pickle) and sends it to every worker
  (applied between batches; each reply carries the version that produced it).
* `trainable()` is a copy made here (the learner trains in this process; `build.trainable_source`: for vllm
  a `transformers` model, no engine).
* `attach_profiler()` gives the run's profile a `policy` row although decoding runs elsewhere: busy while
  any request is in flight (a wall span in this process), the workers' CPU (each worker process bound to
  the stage), replies per second and the round-trip latency of a request.

The workers are started by a `launch.Launcher`: locally (the default) child processes that talk over
`ipc://` files in a private folder, every frame sealed with the pool's own secret; on Ray
(`ray_launch.RayLauncher`) actors on the cluster's nodes that reach this process's tcp sockets, bound on an
ephemeral port each, over CURVE with key pairs each side made for itself. A worker that dies stops the run with
`launch.ChildExited` naming it (no silent restart); a worker also exits by itself if this process dies (it
watches its parent), so no orphan is left behind.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import structlog
import torch
import trio

from pipeline import tensors
from pipeline.config import RunConfig
from pipeline.histogram import LogHistogram
from pipeline.messages import (
    AbandonRequest,
    ActReply,
    ActRequest,
    LoadWeights,
    StageReady,
    WorkerInbox,
    WorkerOutbox,
)
from pipeline.profiling import Profiler
from pipeline.transport import Context, open_context, weights_frame_bytes
from stages.policy.base import (
    ActResult,
    AgentContext,
    Policy,
    PolicyStatistics,
    PolicyStopped,
    TrainableModel,
)

from .launch import Child, Launcher, LocalLauncher, child_spec

log = structlog.get_logger(__name__)


class PolicyWorkerError(RuntimeError):
    """The worker raised while answering this request (fails that one trajectory)."""


@dataclass(eq=False, slots=True)
class _Pending:
    worker: int
    done: trio.Event = field(default_factory=trio.Event)
    reply: ActReply | None = None


def serialise_weights(state: Mapping[str, Any]) -> bytes:
    """A state dict as `LoadWeights` carries it (`pipeline.tensors`: no pickle crosses the socket)."""
    return tensors.pack(dict(state))


def deserialise_weights(blob: bytes) -> dict[str, torch.Tensor]:
    """Raises `tensors.WireError` for bytes that are not a packed state dict."""
    return tensors.unpack_weights(blob)


class WorkerPoolPolicy(Policy):
    """Implements `stages.policy.base.Policy` over `workers` decoding processes."""

    def __init__(self, trainable: Callable[[], TrainableModel], cfg: RunConfig, *, workers: int,
                 launcher: Launcher | None = None) -> None:
        """`trainable` makes a fresh copy of the run's model here (`build.trainable_source`); its weights are
        what every worker loads first."""
        if workers < 1:
            raise ValueError("a worker pool needs at least one worker")
        self._launcher = launcher or LocalLauncher()
        self._sockets: Context | None = None  # the zmq context of the current `serve`
        self.address = ""
        """Where the workers send their replies (while serving; logged with `policy.workers_ready`)."""
        self._dropped: dict[str, dict[str, int]] = {}
        self.version = 0
        self.workers = workers
        self._trainable = trainable
        self._cfg = cfg
        self._weights = serialise_weights(trainable().state_dict())
        self._inboxes: list[trio.MemorySendChannel[WorkerInbox]] = []
        self._outstanding = [0] * workers
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._requests = 0
        self._serving = False
        self._stats = {"answered": 0, "abandoned": 0, "generated_tokens": 0}
        self._round_trips = LogHistogram()
        self._profiler: Profiler | None = None
        self._children: list[Child] = []  # the worker processes of the current `serve`
        self._in_flight_span: Any = None  # the `policy` busy span while requests are outstanding

    # ----------------------------------------------------------------------------------------------
    # Policy protocol

    async def act(self, context: AgentContext, *, greedy: bool = False, number: int | None = None) -> ActResult:
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._serving:
            raise PolicyStopped("WorkerPoolPolicy.serve() is not running")
        request_id, number = self._next_id, self._requests if number is None else number
        self._next_id += 1
        self._requests += 1
        worker = min(range(self.workers), key=self._outstanding.__getitem__)
        pending = self._pending[request_id] = _Pending(worker)
        self._outstanding[worker] += 1
        self._enter_busy()
        started = time.perf_counter()
        try:
            self._post(worker, ActRequest(
                request_id=request_id, task=context.task, observation=context.observation,
                admissible=list(context.admissible), history=list(context.history), greedy=greedy, number=number,
            ))
            await pending.done.wait()
        finally:
            self._outstanding[worker] -= 1
            self._exit_busy()
            del self._pending[request_id]
            if pending.reply is None and self._serving:  # the caller was cancelled: free the worker's slot
                self._stats["abandoned"] += 1
                self._notify(worker, AbandonRequest(request_id=request_id))
        reply = pending.reply
        if reply is None:
            raise PolicyStopped("the decoding workers stopped before answering")
        self._round_trips.add(time.perf_counter() - started)
        if self._profiler is not None:
            self._profiler.latency("policy", "request", time.perf_counter() - started)
            self._profiler.items("policy")
        if reply.error:
            raise PolicyWorkerError(f"decoding worker {reply.worker}: {reply.error}")
        return ActResult(
            action=reply.action, text=reply.text, prompt_ids=reply.prompt_ids, token_ids=reply.token_ids,
            logprobs=reply.logprobs, policy_version=reply.policy_version, choices=reply.choices, nucleus=reply.nucleus,
            entropy=reply.entropy,
        )

    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        """Send to every worker while serving; between serves only keep them: the next `serve` starts its workers
        with these (the last serve's inboxes are closed, so posting there would fail: the off-clock curve loads
        each kept version between the measures' serves)."""
        self._weights = serialise_weights(state)
        self.version = version
        if not self._serving:
            return
        for worker in range(len(self._inboxes)):
            self._post(worker, LoadWeights(version=version, weights=self._weights))

    def trainable(self) -> TrainableModel:
        return self._trainable()

    def attach_profiler(self, profiler: Profiler) -> None:
        """Record decoding as the `policy` stage: in-flight requests as its busy time, the worker processes'
        CPU as its CPU (those running now and any started later), replies as its items."""
        self._profiler = profiler
        for child in self._children:
            if child.pid is not None and not child.ended.is_set():
                profiler.bind_process("policy", child.pid)

    def statistics(self) -> PolicyStatistics:
        answered = self._stats["answered"] > 0
        return PolicyStatistics(requests=self._requests, **self._stats, version=self.version, workers=self.workers,
                              round_trip_p50_s=self._round_trips.quantile(0.5) if answered else None,
                              round_trip_p99_s=self._round_trips.quantile(0.99) if answered else None)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._inboxes, self._outstanding = [], [0] * self.workers
        self._children = [Child("policy", f"decoding worker {worker}") for worker in range(self.workers)]
        async with self._launcher.place("decoder", self._children, env={"OMP_NUM_THREADS": "1"}) as placed:
            async with open_context(**placed.context_options()) as zmq, trio.open_nursery() as nursery:
                outbox = zmq.socket("pull", placed.bind_address("out"), bind=True, receives=WorkerOutbox, name="decoders")
                self._sockets, self.address = zmq, placed.reachable(outbox.address)
                for worker, child in enumerate(self._children):
                    send, receive = trio.open_memory_channel[WorkerInbox](4096)
                    self._inboxes.append(send)
                    inbox = await nursery.start(self._forward, zmq, placed.bind_address(f"in-{worker}"), receive)
                    spec = child_spec("decoder", self._cfg, self._cfg.transport, index=worker,
                                      inbox=placed.reachable(inbox), outbox=placed.reachable(outbox.address),
                                      max_frame=weights_frame_bytes(len(self._weights), copies=2))
                    nursery.start_soon(partial(placed.launch, child, placed.sealed(spec)))
                try:
                    nursery.start_soon(self._dispatch, outbox)
                    for child in self._children:  # all start at once; each says ready on the outbox
                        await child.ready.wait()
                    log.info("policy.workers_ready", workers=self.workers, outbox=self.address)
                    if self._profiler is not None:  # attached before serve: the workers just started count as `policy`
                        self.attach_profiler(self._profiler)
                    for worker in range(self.workers):
                        self._post(worker, LoadWeights(version=self.version, weights=self._weights))
                    self._serving = True
                    task_status.started()
                    await trio.sleep_forever()
                finally:
                    self._serving = False
                    self._dropped = zmq.dropped_frames()
                    self._sockets = None
                    for pending in self._pending.values():
                        pending.done.set()  # no reply: PolicyStopped in act()
                    nursery.cancel_scope.cancel()

    @property
    def children(self) -> tuple[Child, ...]:
        """The decoding workers of the current (or last) `serve`: where each runs (`Child.pid`, `Child.node`)."""
        return tuple(self._children)

    def dropped_frames(self) -> dict[str, dict[str, int]]:
        """The frames (and, on Ray, the refused CURVE handshakes) the pool's sockets dropped, by socket."""
        return self._sockets.dropped_frames() if self._sockets is not None else dict(self._dropped)

    # ----------------------------------------------------------------------------------------------

    def _post(self, worker: int, message: WorkerInbox) -> None:
        try:
            self._inboxes[worker].send_nowait(message)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            raise PolicyStopped(f"cannot reach decoding worker {worker}: {type(exc).__name__}") from exc

    def _notify(self, worker: int, message: AbandonRequest) -> None:
        """Best effort, for a caller that is being cancelled: raising here would replace its `Cancelled` (a
        trajectory cancelled at the phase's end would count as failed), and a worker whose inbox is already
        closed is going away with the request."""
        with contextlib.suppress(PolicyStopped):
            self._post(worker, message)

    async def _forward(self, zmq: Context, address: str, receive: trio.MemoryReceiveChannel[WorkerInbox], *,
                       task_status: trio.TaskStatus[str]) -> None:
        """Own one worker's PUSH socket (started with the address it bound): everything for that worker goes
        through here."""
        push = zmq.socket("push", address, bind=True)
        async with push, receive:
            task_status.started(push.address)
            async for message in receive:
                await push.send(message)

    def _enter_busy(self) -> None:
        if self._profiler is not None and self._in_flight_span is None:
            self._in_flight_span = self._profiler.remote_span("policy", "requests_in_flight")
            self._in_flight_span.__enter__()

    def _exit_busy(self) -> None:
        if self._in_flight_span is not None and not any(self._outstanding):
            self._in_flight_span.__exit__(None, None, None)
            self._in_flight_span = None

    async def _dispatch(self, outbox: Any) -> None:
        async for message in outbox:
            match message:
                case ActReply(request_id=rid):
                    pending = self._pending.get(rid)
                    if pending is not None:
                        pending.reply = message
                        pending.done.set()
                        self._stats["answered"] += 1
                        self._stats["generated_tokens"] += len(message.token_ids)
                case StageReady(stage="decoder", worker=worker) if 0 <= worker < len(self._children):
                    self._children[worker].ready.set()
