"""A decoding worker: the child `decoding_pool.WorkerPoolPolicy` launches (role "decoder" of `launch.py`).

It builds the configured backend (`build.backend`; its weights arrive first as `LoadWeights` from the
pool, so no warm start runs here), serves `ActRequest`s from its inbox (PULL, connected) as concurrent
`act()` calls that the backend batches, and pushes `ActReply`s to the pool's outbox; an `AbandonRequest`
cancels the waiting call. Its frames are sealed with the pool's secret (a child process) or CURVE-encrypted
with its own key pair (a Ray actor, `ray_launch.py`).
"""

from __future__ import annotations

import trio

from pipeline.curve import CurveKeys
from pipeline.messages import (
    AbandonRequest,
    ActReply,
    ActRequest,
    LoadWeights,
    StageReady,
    WorkerInbox,
    WorkerOutbox,
)
from pipeline.transport import MESSAGE_FRAME_BYTES, open_context
from stages.policy.base import AgentContext, Policy

from . import build
from .decoding_pool import deserialise_weights
from .launch import ChildSpec

CLOSE_S = 4.0
"""How long a stopping worker waits for its backend's `close()` (vllm: the engine's shutdown), inside the
5 s its parent (a child process) or `ray_launch.STOP_GRACE_S` (an actor) gives it before killing it."""


async def _answer(policy: Policy, request: ActRequest, index: int, scope: trio.CancelScope,
                  replies: trio.MemorySendChannel[WorkerOutbox]) -> None:
    context = AgentContext(request.task, request.observation, tuple(request.admissible), tuple((seen, did) for seen, did in request.history))
    with scope:
        try:
            result = await policy.act(context, greedy=request.greedy, number=request.number)
        except Exception as exc:  # the caller's trajectory fails, the worker goes on (Cancelled is not caught)
            await replies.send(ActReply(request_id=request.request_id, worker=index, error=f"{type(exc).__name__}: {exc}"))
            return
        await replies.send(ActReply(
            request_id=request.request_id, worker=index, action=result.action, text=result.text,
            prompt_ids=result.prompt_ids, token_ids=result.token_ids, logprobs=result.logprobs,
            policy_version=result.policy_version, choices=result.choices, nucleus=result.nucleus,
            entropy=result.entropy,
        ))


async def serve_decoder(spec: ChildSpec, keys: CurveKeys | None) -> None:
    """A decoding worker (role "decoder" of `launch.py`): builds the backend (its weights arrive first as
    `LoadWeights` from the pool, so no warm start runs here), serves `ActRequest`s from its inbox (PULL,
    connected) as concurrent `act()` calls that the backend batches, and pushes `ActReply`s to the pool's
    outbox. An `AbandonRequest` cancels the waiting call. Its sockets are sealed with the pool's secret, or
    (on Ray) use CURVE with its own `keys`, expecting the pool's `spec.server_key`. However it stops, it
    closes the backend (`Policy.close`: vllm shuts its engine down) before it returns."""
    cfg = spec.config
    policy = build.backend(cfg, build.suite(cfg), warm_start=False)
    try:
        await _serve(policy, spec, keys)
    finally:
        with trio.move_on_after(CLOSE_S, shield=True):  # stopped (cancelled) or failed: release it all the same
            await trio.to_thread.run_sync(policy.close, abandon_on_cancel=True)


async def _serve(policy: Policy, spec: ChildSpec, keys: CurveKeys | None) -> None:
    replies, outgoing = trio.open_memory_channel[WorkerOutbox](4096)
    scopes: dict[int, trio.CancelScope] = {}
    async with open_context(secret=spec.secret, keys=keys) as zmq, trio.open_nursery() as nursery:
        inbox = zmq.socket("pull", spec.inbox, bind=False, receives=WorkerInbox, max_frame=spec.max_frame or MESSAGE_FRAME_BYTES)
        outbox = zmq.socket("push", spec.outbox, bind=False, linger_ms=0)  # a stopped pool reads no more replies
        await nursery.start(policy.serve)

        async def send_replies() -> None:
            async with outbox, outgoing:
                async for message in outgoing:
                    await outbox.send(message)

        nursery.start_soon(send_replies)
        await replies.send(StageReady(stage="decoder", worker=spec.index))
        async with inbox:
            async for message in inbox:
                match message:
                    case ActRequest(request_id=rid):
                        scope = scopes[rid] = trio.CancelScope()
                        nursery.start_soon(_finish, policy, message, spec.index, scope, replies, scopes)
                    case AbandonRequest(request_id=rid):
                        if (abandoned := scopes.pop(rid, None)) is not None:
                            abandoned.cancel()
                    case LoadWeights(version=version, weights=blob):
                        policy.load_weights(version, deserialise_weights(blob))


async def _finish(policy: Policy, request: ActRequest, index: int, scope: trio.CancelScope,
                  replies: trio.MemorySendChannel[WorkerOutbox], scopes: dict[int, trio.CancelScope]) -> None:
    try:
        await _answer(policy, request, index, scope, replies)
    finally:
        scopes.pop(request.request_id, None)
