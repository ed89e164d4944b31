"""A decoding worker process: `python -m pipeline.run.decoder --config RUN.toml --index I --inbox A --outbox B`.

Builds the configured policy backend (its weights arrive first as `LoadWeights` from the pool, so no warm
start runs here), serves `ActRequest`s from its inbox (PULL, connected) as concurrent `act()` calls that the
backend batches, and pushes `ActReply`s to the pool's outbox. An `AbandonRequest` cancels the waiting call.
It exits when its parent process is gone (checked every second), so a killed run leaves no orphan.
"""

from __future__ import annotations

import argparse
import os

import trio

from pipeline.config import load_config
from pipeline.messages import (
    AbandonRequest,
    ActReply,
    ActRequest,
    LoadWeights,
    WorkerInbox,
    WorkerOutbox,
    WorkerReady,
)
from pipeline.rundir import configure_logging
from pipeline.transport import open_context
from stages.envs import build_suite
from stages.policy import POLICIES
from stages.policy.base import AgentContext, Policy
from pipeline.run.decoders import deserialise_weights


async def _answer(policy: Policy, request: ActRequest, index: int, scope: trio.CancelScope,
                  replies: trio.MemorySendChannel[WorkerOutbox]) -> None:
    context = AgentContext(request.task, request.observation, tuple(request.admissible), tuple(map(tuple, request.history)))
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
        ))


async def _watch_parent(parent: int, cancel: trio.CancelScope) -> None:
    """Polls: the death of another process has no event to wait on here."""
    while os.getppid() == parent:  # noqa: ASYNC110
        await trio.sleep(1.0)
    cancel.cancel()


async def serve_worker(config: str, index: int, inbox_address: str, outbox_address: str, parent: int) -> None:
    cfg = load_config(config, ["pretrain.enabled=false", "policy.workers=1"])
    suite = build_suite(cfg.env.name, cfg.env.options, max_steps=cfg.env.max_steps)
    policy = POLICIES.get(cfg.policy.backend)(cfg.policy, cfg.pretrain, suite, seed=cfg.run.seed)
    replies, outgoing = trio.open_memory_channel[WorkerOutbox](4096)
    scopes: dict[int, trio.CancelScope] = {}
    async with open_context() as zmq, trio.open_nursery() as nursery:
        nursery.start_soon(_watch_parent, parent, nursery.cancel_scope)
        inbox = zmq.socket("pull", inbox_address, bind=False, receives=WorkerInbox)
        outbox = zmq.socket("push", outbox_address, bind=False)
        await nursery.start(policy.serve)

        async def send_replies() -> None:
            async with outbox, outgoing:
                async for message in outgoing:
                    await outbox.send(message)

        nursery.start_soon(send_replies)
        await replies.send(WorkerReady(worker=index))
        async with inbox:
            async for message in inbox:
                match message:
                    case ActRequest(request_id=rid):
                        scope = scopes[rid] = trio.CancelScope()
                        nursery.start_soon(_finish, policy, message, index, scope, replies, scopes)
                    case AbandonRequest(request_id=rid):
                        if (scope := scopes.pop(rid, None)) is not None:
                            scope.cancel()
                    case LoadWeights(version=version, weights=blob):
                        policy.load_weights(version, deserialise_weights(blob))


async def _finish(policy: Policy, request: ActRequest, index: int, scope: trio.CancelScope,
                  replies: trio.MemorySendChannel[WorkerOutbox], scopes: dict[int, trio.CancelScope]) -> None:
    try:
        await _answer(policy, request, index, scope, replies)
    finally:
        scopes.pop(request.request_id, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--inbox", required=True)
    parser.add_argument("--outbox", required=True)
    args = parser.parse_args()
    configure_logging(None)
    try:
        trio.run(serve_worker, args.config, args.index, args.inbox, args.outbox, os.getppid())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
