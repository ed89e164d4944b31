"""The learner rescores the hf policy's choices: ratio exactly 1 at unchanged weights, whatever the batch."""

from __future__ import annotations

import random

import pytest
import torch
import trio

pytest.importorskip("transformers", reason="the hf backend needs transformers (the `hf` extra)")

from stages.policy.hf._learner import ChoiceTrainable  # noqa: E402
from stages.policy.vllm._lora import LoraSettings, adapter_state  # noqa: E402

from .conftest import CONTEXTS  # noqa: E402
from .test_server import act_in_order, make_policy, serving  # noqa: E402


async def _sampled(policy, contexts):  # noqa: ANN001, ANN202
    async with serving(policy):
        return await act_in_order(policy, contexts)


def _rescored(model: ChoiceTrainable, results, *, temperature: float, top_p: float) -> list[list[float]]:  # noqa: ANN001
    scores = model.completion_logprobs(
        [r.prompt_ids for r in results], [r.token_ids for r in results], temperature=temperature, top_p=top_p,
        choices=[r.choices for r in results], nucleus=[r.nucleus for r in results] if any(r.nucleus for r in results) else None,
    )
    return [scores.logprobs[i, : len(r.token_ids)].tolist() for i, r in enumerate(results)]


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 0.95), (0.5, 0.5), (1.0, 1.0)])
async def test_the_learner_scores_exactly_the_behaviour_log_probs_alone_and_in_any_batch(lm, prompt, temperature, top_p) -> None:  # noqa: ANN001
    policy = make_policy(lm, prompt, seed=9, temperature=temperature, top_p=top_p, max_wait_ms=1000)
    results = await _sampled(policy, CONTEXTS * 2)  # 16 turns; each context twice (a repeated row)
    assert len({tuple(r.token_ids) for r in results}) >= 3
    model = ChoiceTrainable(lm, temperature=temperature, top_p=top_p)  # the same weights, with gradients
    model.lm.requires_grad_(True).train()
    behaviour = [r.logprobs for r in results]
    rng = random.Random(0)
    for size in (1, 3, 16):  # micro-batches of 1, of 3 and all 16 together, in a shuffled order
        order = list(range(len(results)))
        rng.shuffle(order)
        for lo in range(0, len(order), size):
            chunk = order[lo : lo + size]
            rescored = _rescored(model, [results[i] for i in chunk], temperature=temperature, top_p=top_p)
            for i, new in zip(chunk, rescored, strict=True):
                torch.testing.assert_close(torch.tensor(new), torch.tensor(behaviour[i]), atol=1e-5, rtol=0)


async def test_the_learners_gradient_moves_the_chosen_commands_probability(lm, prompt) -> None:  # noqa: ANN001
    results = await _sampled(make_policy(lm, prompt, seed=1), CONTEXTS[:4])
    model = ChoiceTrainable(lm, temperature=0.7, top_p=0.95)
    model.lm.requires_grad_(True).train()
    scores = model.completion_logprobs([r.prompt_ids for r in results], [r.token_ids for r in results],
                                       choices=[r.choices for r in results], nucleus=[r.nucleus for r in results])
    assert scores.mask.tolist() == [[1.0] * len(r.token_ids) + [0.0] * (scores.mask.shape[1] - len(r.token_ids)) for r in results]
    assert bool((scores.entropy >= 0).all())
    (scores.logprobs * scores.mask).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads) and any(float(g.abs().sum()) > 0 for g in grads)


async def test_a_completion_that_is_not_among_its_choices_is_refused(lm, prompt) -> None:  # noqa: ANN001
    (result,) = await _sampled(make_policy(lm, prompt), CONTEXTS[:1])
    model = ChoiceTrainable(lm, temperature=0.7, top_p=0.95)
    with pytest.raises(ValueError, match="not one of its choices"):
        model.completion_logprobs([result.prompt_ids], [[5, 6]], choices=[result.choices])


async def test_lora_the_learners_adapter_served_merged_keeps_the_ratio_at_one(model_dir, prompt) -> None:  # noqa: ANN001
    """The loop of a LoRA run: the learner trains its peft adapter, the policy serves it merged by version,
    and the learner rescores the turns that version sampled: the same log-probs (up to float rounding)."""
    pytest.importorskip("peft", reason="LoRA needs peft (the `hf` extra)")
    from transformers import AutoModelForCausalLM

    lora = LoraSettings(4, 8.0, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    learner = ChoiceTrainable.load(str(model_dir), temperature=0.7, top_p=0.95, lora=lora)
    with torch.no_grad():
        for name, p in learner.lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)  # as if trained: B != 0
    served = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    policy = make_policy(served, prompt, seed=4, lora=lora, model_path=str(model_dir), max_wait_ms=1000)
    policy.load_weights(3, adapter_state(learner.lm))
    results = await _sampled(policy, CONTEXTS)
    assert {r.policy_version for r in results} == {3}
    rescored = _rescored(learner, results, temperature=0.7, top_p=0.95)
    for r, new in zip(results, rescored, strict=True):
        torch.testing.assert_close(torch.tensor(new), torch.tensor(r.logprobs), atol=1e-4, rtol=0)
    fresh = policy.trainable()  # the policy's trainable copy holds the adapter it serves
    again = _rescored(fresh, results, temperature=0.7, top_p=0.95)
    torch.testing.assert_close(torch.tensor(sum(again, [])), torch.tensor(sum(rescored, [])), atol=1e-5, rtol=0)
    await trio.lowlevel.checkpoint()
