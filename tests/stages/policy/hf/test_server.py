"""The hf policy under Trio: choices among the admissible commands, their distribution, batching
invariance, cancellation, weight versions (full and LoRA merged)."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import torch
import trio
import trio.testing

pytest.importorskip("transformers", reason="the hf backend needs transformers (the `hf` extra)")

from stages.policy.base import ActResult, AgentContext, PolicyStopped  # noqa: E402
from stages.policy.hf._scoring import choice_scores  # noqa: E402
from stages.policy.hf._server import HfPolicy, HfSampling, command_choices  # noqa: E402
from stages.policy.torch_tiny._commands import command_logdist  # noqa: E402
from stages.policy.vllm._lora import LoraSettings  # noqa: E402

from ..fake_suite import PLACES  # noqa: E402
from .conftest import CONTEXTS, tiny_lm  # noqa: E402


def make_policy(lm, prompt, *, seed: int = 0, lora: LoraSettings | None = None, model_path: str = "unused", **sampling) -> HfPolicy:  # noqa: ANN001, ANN003
    return HfPolicy(lm, prompt, HfSampling(**sampling), model_path=model_path, seed=seed, lora=lora)


@asynccontextmanager
async def serving(policy: HfPolicy) -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        yield nursery
        nursery.cancel_scope.cancel()


async def act_in_order(policy: HfPolicy, contexts: list[AgentContext], **kw: bool) -> list[ActResult]:
    """One concurrent act() per context, each entering act() (and so numbered) before the next starts."""
    results: list[ActResult | None] = [None] * len(contexts)

    async def one(i: int) -> None:
        results[i] = await policy.act(contexts[i], **kw)

    async with trio.open_nursery() as nursery:
        for i in range(len(contexts)):
            nursery.start_soon(one, i)
            await trio.testing.wait_all_tasks_blocked()
    return [r for r in results if r is not None]


async def test_act_needs_a_running_server(lm, prompt) -> None:  # noqa: ANN001
    with pytest.raises(PolicyStopped):
        await make_policy(lm, prompt).act(CONTEXTS[0])


async def test_every_action_is_an_admissible_command_recorded_with_its_choices(lm, prompt) -> None:  # noqa: ANN001
    policy = make_policy(lm, prompt, seed=3)
    async with serving(policy):
        results = await act_in_order(policy, CONTEXTS)
    for context, result in zip(CONTEXTS, results, strict=True):
        actions, commands = command_choices(prompt, context.admissible)
        assert result.action in context.admissible and result.text == result.action
        assert result.choices == commands and result.token_ids == prompt.completion(result.action)
        assert result.token_ids[-1] == prompt.tokenizer.eos_token_id
        assert result.prompt_ids == prompt.build(context)
        assert len(result.logprobs) == len(result.token_ids) == len(result.nucleus)
        assert len(set(result.nucleus)) == 1 and 1 <= result.nucleus[0] <= len(commands)
        assert sum(result.logprobs) <= 0 and all(math.isfinite(x) for x in result.logprobs)
    stats = policy.statistics()
    assert stats.requests == 8 and stats.commands_scored == sum(len(c.admissible) for c in CONTEXTS)
    assert stats.rows_scored == 8 and stats.generated_tokens == sum(len(r.token_ids) for r in results)
    assert stats.prompt_tokens == sum(len(r.prompt_ids) for r in results)
    assert stats.command_tokens == sum(len(t) for r in results for t in r.choices)


async def test_the_choice_distribution_is_softmax_of_scores_over_temperature_in_the_nucleus(lm, prompt) -> None:  # noqa: ANN001
    # five commands of one length: the untrained model's scores differ by tenths, a spread distribution
    context = AgentContext("take the key", "you are in a room.", tuple(f"go to {p}" for p in PLACES))
    policy = make_policy(lm, prompt, seed=11, temperature=0.7, top_p=0.95, max_wait_ms=1000)
    n = 400
    async with serving(policy):
        results = await act_in_order(policy, [context] * n)
    _, commands = command_choices(prompt, context.admissible)
    stats = policy.statistics()
    assert stats.requests == n and stats.rows_scored == stats.batches < n  # one prompt: scored once per batch
    with torch.no_grad():
        scores = choice_scores(lm, [prompt.build(context)], [commands])  # [1, K]
    assert len(set(scores[0].tolist())) == len(commands)
    # the recorded log-prob of each command is log pi(c) of the tempered, nucleus-truncated softmax
    for result in results:
        j = commands.index(result.token_ids)
        pi = command_logdist(scores, torch.tensor([j]), temperature=0.7, top_p=0.95, nucleus=torch.tensor([result.nucleus[0]]))
        assert sum(result.logprobs) == pytest.approx(float(pi[0, j]), abs=1e-5)
    # and the commands are drawn with those probabilities (4 sigma of a binomial count)
    counts = Counter(commands.index(r.token_ids) for r in results)
    pi = command_logdist(scores, scores.argmax(dim=1), temperature=0.7, top_p=0.95).exp()[0]  # [K]
    for j in range(len(commands)):
        expected = n * float(pi[j])
        assert abs(counts[j] - expected) <= 4 * math.sqrt(max(expected * (1 - float(pi[j])), 1.0)), (j, counts, pi)
    assert sum(1 for j in range(len(commands)) if counts[j]) >= 2  # sampled, not argmax


async def test_greedy_takes_the_best_scoring_command(lm, prompt) -> None:  # noqa: ANN001
    policy = make_policy(lm, prompt)
    async with serving(policy):
        results = await act_in_order(policy, CONTEXTS, greedy=True)
    for context, result in zip(CONTEXTS, results, strict=True):
        _, commands = command_choices(prompt, context.admissible)
        with torch.no_grad():
            scores = choice_scores(lm, [prompt.build(context)], [commands])[0]
        assert result.token_ids == commands[int(scores.argmax())]


async def test_batching_does_not_change_a_requests_choice_or_log_probs(lm, prompt) -> None:  # noqa: ANN001
    one_by_one = make_policy(lm, prompt, seed=5, max_batch=1)
    async with serving(one_by_one):
        alone = [await one_by_one.act(c) for c in CONTEXTS]
    batched = make_policy(lm, prompt, seed=5, max_batch=8, max_wait_ms=10_000)
    async with serving(batched):
        together = await act_in_order(batched, CONTEXTS)
    assert one_by_one.statistics().batches == 8 and batched.statistics().batches == 1
    for a, b in zip(alone, together, strict=True):
        assert (a.token_ids, a.action, a.nucleus) == (b.token_ids, b.action, b.nucleus)
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6, rtol=0)


async def test_a_context_without_admissible_commands_gets_the_empty_action_and_no_tokens(lm, prompt) -> None:  # noqa: ANN001
    policy = make_policy(lm, prompt, empty_output_action="look")
    async with serving(policy):
        result, other = await act_in_order(policy, [AgentContext("take the key", "a room.", ()), CONTEXTS[0]])
    assert (result.action, result.token_ids, result.logprobs, result.choices) == ("look", [], [], [])
    assert other.action in CONTEXTS[0].admissible


def test_commands_are_chosen_among_once_each(prompt) -> None:  # noqa: ANN001
    actions, commands = command_choices(prompt, ("look", "go to shelf 1", "look"))
    assert actions == ["look", "go to shelf 1"] and len(commands) == 2


async def test_a_cancelled_caller_does_not_disturb_its_batch(lm, prompt) -> None:  # noqa: ANN001
    reference = make_policy(lm, prompt, seed=2, max_wait_ms=10_000, max_batch=3)
    async with serving(reference):
        expected = await act_in_order(reference, CONTEXTS[:3])
    policy = make_policy(lm, prompt, seed=2, max_wait_ms=10_000, max_batch=3)
    entered, gate = threading.Event(), threading.Event()
    score = policy._score_in_worker

    def blocked(batch):  # noqa: ANN001, ANN202
        entered.set()
        gate.wait()
        return score(batch)

    policy._score_in_worker = blocked  # type: ignore[method-assign]
    results: dict[int, ActResult] = {}
    async with serving(policy), trio.open_nursery() as nursery:
        scopes = []
        for i in range(3):
            scope = trio.CancelScope()
            scopes.append(scope)

            async def one(i: int = i, scope: trio.CancelScope = scope) -> None:
                with scope:
                    results[i] = await policy.act(CONTEXTS[i])

            nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()
        await trio.to_thread.run_sync(entered.wait)
        scopes[1].cancel()  # cancelled while its batch is scored
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert sorted(results) == [0, 2]
    for i in (0, 2):
        assert results[i].token_ids == expected[i].token_ids and results[i].logprobs == expected[i].logprobs


async def test_full_weights_take_effect_between_batches_and_carry_their_version(lm, prompt, tokenizer) -> None:  # noqa: ANN001
    other = tiny_lm(tokenizer, seed=7)
    policy = make_policy(lm, prompt)
    async with serving(policy):
        before = await policy.act(CONTEXTS[3], greedy=True)
        policy.load_weights(4, other.state_dict())
        after = await policy.act(CONTEXTS[3], greedy=True)
    assert (before.policy_version, after.policy_version, policy.version) == (0, 4, 4)
    with torch.no_grad():
        expected = choice_scores(other, [prompt.build(CONTEXTS[3])], [after.choices])[0]
    assert after.token_ids == after.choices[int(expected.argmax())]
    with pytest.raises(ValueError, match="do not fit"):
        policy.load_weights(5, {"model.embed_tokens.weight": torch.zeros(3, 3)})


async def test_a_lora_version_is_served_merged_and_scores_what_the_peft_model_scores(lm, prompt, tokenizer) -> None:  # noqa: ANN001
    pytest.importorskip("peft", reason="LoRA needs peft (the `hf` extra)")
    from stages.policy.vllm._lora import adapter_state, apply_lora

    lora = LoraSettings(4, 8.0, ("q_proj", "v_proj", "gate_proj"))
    peft_lm = apply_lora(tiny_lm(tokenizer), lora)
    with torch.no_grad():
        for name, p in peft_lm.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.5)  # a trained adapter (B != 0)
    policy = make_policy(lm, prompt, lora=lora, max_wait_ms=1000)
    rows = [prompt.build(c) for c in CONTEXTS]
    choices = [command_choices(prompt, c.admissible)[1] for c in CONTEXTS]
    async with serving(policy):
        policy.load_weights(1, adapter_state(peft_lm))
        results = await act_in_order(policy, CONTEXTS, greedy=True)
        policy.load_weights(2, adapter_state(peft_lm))  # merged from the base again, not on top of version 1
        again = await act_in_order(policy, CONTEXTS, greedy=True)
    with torch.no_grad():
        served = choice_scores(policy.model, rows, choices)
        adapted = choice_scores(peft_lm.eval(), rows, choices)
        base = choice_scores(tiny_lm(tokenizer), rows, choices)  # the weights `lm` had before it served
    torch.testing.assert_close(served, adapted, atol=1e-4, rtol=1e-5)
    assert not torch.allclose(served, base, atol=1e-2)
    assert {r.policy_version for r in results} == {1} and {r.policy_version for r in again} == {2}
    assert [r.token_ids for r in results] == [r.token_ids for r in again]
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        policy.load_weights(3, {"model.embed_tokens.weight": torch.zeros(1)})
