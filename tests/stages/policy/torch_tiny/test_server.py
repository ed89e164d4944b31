"""The batching server under Trio: batching invariance, cancellation, weight versions, shutdown."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import torch
import trio
import trio.testing

from stages.policy.base import ActResult, AgentContext, PolicyStopped
from stages.policy.torch_tiny import PromptFormat, TinyLM, TorchTinyPolicy

from .conftest import make_policy, tiny_model

CONTEXTS = [
    AgentContext(
        f"take the {obj}", f"you are in a room. the {obj} is on shelf {i % 2 + 1}.", ("look", "go to shelf 1")
    )
    for i, obj in enumerate(["key", "cup", "book", "apple"] * 2)
]


@asynccontextmanager
async def serving(policy: TorchTinyPolicy) -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        yield nursery
        nursery.cancel_scope.cancel()


async def act_in_order(policy: TorchTinyPolicy, contexts: list[AgentContext], **kw: bool) -> list[ActResult]:
    """One concurrent act() per context, each entering act() (and so numbered) before the next starts."""
    results: list[ActResult | None] = [None] * len(contexts)

    async def one(i: int) -> None:
        results[i] = await policy.act(contexts[i], **kw)

    async with trio.open_nursery() as nursery:
        for i in range(len(contexts)):
            nursery.start_soon(one, i)
            await trio.testing.wait_all_tasks_blocked()
    return [r for r in results if r is not None]


def block_worker(policy: TorchTinyPolicy) -> tuple[threading.Event, threading.Event]:
    """Make the decoding worker wait for `gate` after signalling `entered`."""
    entered, gate = threading.Event(), threading.Event()
    decode: Callable = policy._decode_in_worker

    def blocked(jobs):  # noqa: ANN001, ANN202
        entered.set()
        gate.wait()
        return decode(jobs)

    policy._decode_in_worker = blocked  # type: ignore[method-assign]
    return entered, gate


def _same(a: ActResult, b: ActResult) -> None:
    assert (a.token_ids, a.action, a.text, a.prompt_ids) == (b.token_ids, b.action, b.text, b.prompt_ids)
    torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)


async def test_act_needs_a_running_server(model: TinyLM, fmt: PromptFormat) -> None:
    with pytest.raises(PolicyStopped):
        await make_policy(model, fmt).act(CONTEXTS[0])


async def test_batching_does_not_change_results_for_a_fixed_seed(model: TinyLM, fmt: PromptFormat) -> None:
    one_by_one = make_policy(model, fmt, seed=5, max_batch=1)
    async with serving(one_by_one):
        alone = [await one_by_one.act(c) for c in CONTEXTS]
    batched = make_policy(model, fmt, seed=5, max_batch=8, max_wait_ms=10_000)  # one batch of 8
    async with serving(batched):
        together = await act_in_order(batched, CONTEXTS)
    assert one_by_one.statistics().batches == 8
    assert batched.statistics().batches == 1
    for a, b in zip(alone, together, strict=True):
        _same(a, b)


async def test_sampling_is_reproducible_by_seed(model: TinyLM, fmt: PromptFormat) -> None:
    texts = []
    for seed in (1, 1, 2):
        policy = make_policy(model, fmt, seed=seed)
        async with serving(policy):
            texts.append([(await policy.act(c)).token_ids for c in CONTEXTS])
    assert texts[0] == texts[1] != texts[2]


async def test_greedy_ignores_the_seed(model: TinyLM, fmt: PromptFormat) -> None:
    outs = []
    for seed in (1, 2):
        policy = make_policy(model, fmt, seed=seed)
        async with serving(policy):
            outs.append([(await policy.act(c, greedy=True)).token_ids for c in CONTEXTS])
    assert outs[0] == outs[1]


async def test_cancelling_a_caller_mid_batch_leaves_the_others_intact(
    model: TinyLM, fmt: PromptFormat
) -> None:
    reference = make_policy(model, fmt, seed=3, max_batch=3, max_wait_ms=10_000)
    async with serving(reference):
        expected = await act_in_order(reference, CONTEXTS[:3])

    policy = make_policy(model, fmt, seed=3, max_batch=3, max_wait_ms=10_000)
    entered, gate = block_worker(policy)
    results: list[ActResult | None] = [None] * 3
    victim = trio.CancelScope()
    others_done = trio.Event()

    async def one(i: int) -> None:
        with victim if i == 1 else trio.CancelScope():
            results[i] = await policy.act(CONTEXTS[i])
        if results[0] is not None and results[2] is not None:
            others_done.set()

    async with serving(policy) as nursery:
        for i in range(3):
            nursery.start_soon(one, i)
            await trio.testing.wait_all_tasks_blocked()
        await trio.to_thread.run_sync(entered.wait)  # the batch of three is decoding now
        victim.cancel()
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await others_done.wait()
    assert victim.cancelled_caught
    assert results[1] is None
    for i in (0, 2):
        _same(results[i], expected[i])  # type: ignore[arg-type]
    stats = policy.statistics()
    assert (stats.batches, stats.requests, stats.answered, stats.abandoned) == (1, 3, 2, 1)  # decoded, then abandoned
    assert stats.generated_tokens >= sum(len(results[i].token_ids) for i in (0, 2)) > 0  # the victim's were decoded too


async def test_a_request_cancelled_while_queued_is_dropped(model: TinyLM, fmt: PromptFormat) -> None:
    policy = make_policy(model, fmt, max_batch=1)
    entered, gate = block_worker(policy)
    queued = trio.CancelScope()

    async def cancelled_caller() -> None:
        with queued:
            await policy.act(CONTEXTS[1])

    async with serving(policy) as nursery:
        nursery.start_soon(policy.act, CONTEXTS[0])
        await trio.to_thread.run_sync(entered.wait)  # request 0 is decoding, request 1 will queue
        nursery.start_soon(cancelled_caller)
        await trio.testing.wait_all_tasks_blocked()
        queued.cancel()
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
        await policy.act(CONTEXTS[2])
    assert queued.cancelled_caught
    stats = policy.statistics()
    assert (stats.batches, stats.requests, stats.answered, stats.abandoned) == (2, 3, 2, 1)  # the queued one never decoded


async def test_new_weights_apply_between_batches_and_results_carry_their_version(
    model: TinyLM, fmt: PromptFormat, tokenizer
) -> None:
    other = tiny_model(tokenizer, seed=11)
    expected = make_policy(other, fmt)
    async with serving(expected):
        after = [await expected.act(c, greedy=True) for c in CONTEXTS[:4]]

    policy = make_policy(model, fmt)
    async with serving(policy):
        before = await policy.act(CONTEXTS[0], greedy=True)
        state = other.state_dict()
        policy.load_weights(7, state)
        with torch.no_grad():  # the queued weights are a snapshot: later changes do not leak in
            state["tok_emb.weight"].add_(1.0)
        assert policy.version == 0  # queued, applied before the next batch
        got = [await policy.act(c, greedy=True) for c in CONTEXTS[:4]]
    assert before.policy_version == 0
    assert policy.version == 7
    assert [r.policy_version for r in got] == [7] * 4
    assert [r.token_ids for r in got] == [r.token_ids for r in after]
    assert before.token_ids != got[0].token_ids or before.logprobs != got[0].logprobs


async def test_weights_that_do_not_fit_are_refused_at_once(model: TinyLM, fmt: PromptFormat) -> None:
    policy = make_policy(model, fmt)
    state = dict(model.state_dict())
    state.pop("ln_f.bias")
    with pytest.raises(ValueError, match="missing"):
        policy.load_weights(1, state)
    with pytest.raises(ValueError, match="do not fit"):
        policy.load_weights(1, {**model.state_dict(), "ln_f.bias": torch.zeros(3)})


async def test_stopping_the_server_answers_the_batch_in_flight_and_fails_the_queue(
    model: TinyLM, fmt: PromptFormat
) -> None:
    policy = make_policy(model, fmt, max_batch=1)
    entered, gate = block_worker(policy)
    outcomes: dict[str, object] = {}

    async def caller(name: str, ctx: AgentContext) -> None:
        try:
            outcomes[name] = await policy.act(ctx)
        except PolicyStopped as exc:
            outcomes[name] = exc

    async with trio.open_nursery() as outer:
        with trio.CancelScope() as serve_scope:
            async with trio.open_nursery() as inner:
                await inner.start(policy.serve)
                outer.start_soon(caller, "decoding", CONTEXTS[0])
                await trio.to_thread.run_sync(entered.wait)
                outer.start_soon(caller, "queued", CONTEXTS[1])
                await trio.testing.wait_all_tasks_blocked()
                serve_scope.cancel()  # serve() waits for the worker thread, never abandons it
                gate.set()
    assert isinstance(outcomes["decoding"], ActResult)
    assert isinstance(outcomes["queued"], PolicyStopped)
    with pytest.raises(PolicyStopped):
        await policy.act(CONTEXTS[2])


async def test_trainable_is_an_independent_copy_with_ratio_one(model: TinyLM, fmt: PromptFormat) -> None:
    policy = make_policy(model, fmt, seed=9)
    async with serving(policy):
        results = await act_in_order(policy, CONTEXTS)
    learner = policy.trainable()
    assert all(p.requires_grad for p in learner.parameters())
    assert learner.training
    logp, mask, _ = learner.completion_logprobs([r.prompt_ids for r in results], [r.token_ids for r in results])
    old = torch.zeros_like(logp)
    for i, r in enumerate(results):
        old[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
    ratio = torch.exp((logp.detach() - old) * mask)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
    with torch.no_grad():
        next(learner.parameters()).add_(1.0)
    assert not torch.equal(next(learner.parameters()), next(policy.model.parameters()))


async def test_choose_admissible_acts_only_admissible_commands_and_records_the_choices(
    model: TinyLM, fmt: PromptFormat
) -> None:
    policy = make_policy(model, fmt, seed=4, choose_admissible=True)
    async with serving(policy):
        results = await act_in_order(policy, CONTEXTS)
    for context, result in zip(CONTEXTS, results, strict=True):
        assert result.action in context.admissible
        assert result.choices == [fmt.completion(c) for c in context.admissible]
    learner = policy.trainable()
    scores = learner.completion_logprobs(
        [r.prompt_ids for r in results], [r.token_ids for r in results],
        temperature=policy.sampling.temperature, top_p=policy.sampling.top_p, choices=[r.choices for r in results],
    )
    for i, r in enumerate(results):
        torch.testing.assert_close(scores.logprobs[i, : len(r.logprobs)], torch.tensor(r.logprobs), atol=1e-5, rtol=0)
