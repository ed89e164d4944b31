"""VllmPolicy's Trio <-> asyncio bridge, abort on cancellation and weight versions, on a fake AsyncLLM."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch
import trio

from pipeline.run.updates import Phase
from stages.policy.base import AgentContext, PolicyStatistics, PolicyStopped
from stages.policy.vllm._loop import LoopThread
from stages.policy.vllm._prompt import ChatPrompt
from stages.policy.vllm._server import VllmPolicy
from stages.policy.vllm._vllm_api import Sampling

from .fakes import FakeEngine, WordTok, fake_params

CTX = AgentContext("find the mug", "you see a mug 1", ("take mug 1", "look"))
SHAPES = {"w": (2, 2)}


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread("test-vllm")
    yield thread
    thread.close()


def make_policy(loop: LoopThread, engine: FakeEngine) -> VllmPolicy:
    return VllmPolicy(
        loop,
        engine,
        ChatPrompt(WordTok()),
        Sampling(temperature=0.7, top_p=0.95, max_new_tokens=4, seeded=True),
        model_path="fake",
        shapes=SHAPES,
        seed=3,
        make_params=fake_params,
    )


async def test_act_returns_the_engine_completion_parsed_and_stamped(loop: LoopThread) -> None:
    engine = FakeEngine()
    policy = make_policy(loop, engine)
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        first = await policy.act(CTX)
        second = await policy.act(CTX, greedy=True)
        nursery.cancel_scope.cancel()
    assert first.action == "look" and first.token_ids == [7, 1] and first.logprobs == [-0.5, -0.25]
    assert first.policy_version == 0 and first.prompt_ids == policy.prompt.build(CTX)
    assert engine.params[0]["seed"] != engine.params[1]["seed"]  # one seed per request number
    assert engine.params[1]["greedy"] is True and engine.params[0]["stop"] == [WordTok.eos_token_id]
    assert policy.statistics().answered == 2 and second.action == "look"


async def test_a_pool_assigned_number_seeds_the_request_and_the_engine_id_stays_unique(loop: LoopThread) -> None:
    engine = FakeEngine()
    policy = make_policy(loop, engine)
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        for _ in range(2):  # two decoding workers' pools may hand out the same number: the ids must still differ
            await policy.act(CTX, number=5)
        await policy.act(CTX)
        nursery.cancel_scope.cancel()
    assert engine.params[0]["seed"] == engine.params[1]["seed"] != engine.params[2]["seed"]  # the number names the stream
    assert len(set(engine.request_ids)) == 3


async def test_cancelled_act_aborts_its_engine_request(loop: LoopThread) -> None:
    engine = FakeEngine(block=True)
    engine.abort_seen = loop.run(_event())
    policy = make_policy(loop, engine)
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        running = _running_event(engine)
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_when, running, scope)
            await policy.act(CTX)
        await trio.to_thread.run_sync(loop.run, engine.abort_seen.wait())
        nursery.cancel_scope.cancel()
    assert scope.cancelled_caught
    assert engine.aborted == ["rollcut-0"] and not engine.running
    stats = policy.statistics()
    assert stats.abandoned == 1 and stats.abort_p50_s is not None and stats.abort_p50_s >= 0


async def test_serve_exit_fails_waiting_requests_and_later_calls(loop: LoopThread) -> None:
    engine = FakeEngine(block=True)
    policy = make_policy(loop, engine)
    with pytest.raises(PolicyStopped):
        await policy.act(CTX)
    caught: list[BaseException] = []

    async def caller() -> None:
        try:
            await policy.act(CTX)
        except PolicyStopped as exc:
            caught.append(exc)

    async with trio.open_nursery() as outer:
        running = _running_event(engine)
        async with trio.open_nursery() as serving:
            await serving.start(policy.serve)
            outer.start_soon(caller)
            await running.wait()
            serving.cancel_scope.cancel()
    assert len(caught) == 1


async def test_weights_reach_the_engine_by_version(loop: LoopThread) -> None:
    engine = FakeEngine()
    policy = make_policy(loop, engine)
    with pytest.raises(ValueError, match="do not fit"):
        policy.load_weights(1, {"w": torch.zeros(3, 3)})
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        policy.load_weights(1, {"w": torch.ones(2, 2), "tied.extra": torch.ones(1)})
        assert await trio.to_thread.run_sync(policy.wait_synced) == 1
        result = await policy.act(CTX)
        nursery.cancel_scope.cancel()
    (method, (version, weights)), = engine.rpcs
    assert method == "rollcut_load_weights" and version == 1
    assert [name for name, *_ in weights] == ["w"]  # only checkpoint tensors are sent
    assert result.policy_version == 1 and policy.version == 1
    assert policy.statistics().weight_syncs == 1


async def test_request_submitted_during_a_sync_carries_the_older_version(loop: LoopThread) -> None:
    engine = FakeEngine()
    engine.hold_rpc = loop.run(_event())
    policy = make_policy(loop, engine)
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        policy.load_weights(1, {"w": torch.ones(2, 2)})
        during = await policy.act(CTX)
        loop.loop.call_soon_threadsafe(engine.hold_rpc.set)
        await trio.to_thread.run_sync(policy.wait_synced)
        after = await policy.act(CTX)
        nursery.cancel_scope.cancel()
    assert (during.policy_version, after.policy_version) == (0, 1)


async def test_failed_weight_sync_ends_serve_with_the_error(loop: LoopThread) -> None:
    policy = make_policy(loop, FakeEngine(fail_rpc=True))

    async def serve_and_publish() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(policy.serve)
            policy.load_weights(1, {"w": torch.ones(2, 2)})

    with pytest.raises(ExceptionGroup) as info:
        await serve_and_publish()
    assert info.group_contains(RuntimeError, match="weight sync failed")
    assert policy.version == 0


def test_close_shuts_the_engine_down_once() -> None:
    engine = FakeEngine()
    policy = make_policy(LoopThread(), engine)
    policy.close()
    policy.close()
    assert engine.shut_down and not policy._loop.thread.is_alive()


async def _event() -> asyncio.Event:
    return asyncio.Event()


def _running_event(engine: FakeEngine) -> trio.Event:
    """A Trio event the loop thread sets when the engine receives a request."""
    event, token = trio.Event(), trio.lowlevel.current_trio_token()
    engine.on_running = lambda: token.run_sync_soon(event.set)
    return event


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def test_wire_tensors_round_trip() -> None:
    from stages.policy.vllm._worker import from_wire, to_wire

    for tensor in (torch.randn(3, 4), torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.randn(5).half()):
        name, back = from_wire(to_wire("x", tensor))
        assert name == "x" and back.dtype == tensor.dtype and torch.equal(back, tensor)


async def test_statistics_are_the_run_s_record_and_count_generated_tokens(loop: LoopThread) -> None:
    # The run reads `statistics().generated_tokens` (summary, held-out rows, the A/B's tokens-to-target); it was
    # a dict here, so a vLLM run recorded no token figure.
    policy = make_policy(loop, FakeEngine())
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        results = [await policy.act(CTX) for _ in range(3)]
        nursery.cancel_scope.cancel()
    stats = policy.statistics()
    assert isinstance(stats, PolicyStatistics)
    assert stats.generated_tokens == sum(len(r.token_ids) for r in results) > 0
    assert (stats.requests, stats.answered, stats.abandoned, stats.version) == (3, 3, 0, 0)
    phase = Phase(*[None] * 7, policy=policy, gate=None, dropped_frames=dict, tokens_at_start=2)  # type: ignore[arg-type]
    assert phase.generated_tokens() == stats.generated_tokens - 2  # what a metrics row / held-out row records
