"""Choosing whole commands: packed scoring, the command distribution and its next-token factors."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from stages.policy.torch_tiny import ModelConfig, TinyLM, generate
from stages.policy.torch_tiny._commands import (
    chosen_factors,
    command_logdist,
    command_scores,
    distinct_rows,
    pack,
    padded_commands,
    token_factors,
)

PROMPTS = [[1, 5, 6, 7], [1, 8, 9, 10, 11, 7]]
CHOICES = [[[3, 4, 2], [3, 5, 2], [6, 2]], [[12, 2], [12, 13, 14, 2]]]


@pytest.fixture
def model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(ModelConfig(vocab_size=20, pad_id=0, layers=2, d_model=32, heads=4, max_len=32)).eval()


def _alone(model: TinyLM, prompt, command) -> float:
    with torch.no_grad():
        return float(model.completion_logprobs([prompt], [command]).logprobs.sum())


def test_a_packed_command_scores_what_it_scores_alone(model: TinyLM) -> None:
    scores = command_scores(model, PROMPTS, CHOICES)  # [2, 3]
    for row, (prompt, options) in enumerate(zip(PROMPTS, CHOICES, strict=True)):
        for j, command in enumerate(options):
            assert float(scores[row, j].detach()) == pytest.approx(_alone(model, prompt, command), abs=1e-4)
    assert scores[1, 2] == float("-inf")  # row 1 has two commands


def test_pack_lets_a_command_see_the_prompt_and_its_own_tokens_only() -> None:
    packed = pack([[1, 2]], [[[3, 4], [5, 6]]], pad_id=0)
    allowed = packed.allowed[0, 0]  # [L, L]: prompt 0-1, command 0 at 2-3, command 1 at 4-5
    assert allowed[3].tolist() == [True, True, True, True, False, False]
    assert allowed[4].tolist() == [True, True, False, False, True, False]
    assert packed.positions[0].tolist() == [0, 1, 2, 3, 2, 3]  # each command starts after the prompt
    assert packed.predict_at[0].tolist() == [1, 2, 1, 4]  # the first token of each is predicted by the prompt


def test_next_token_factors_multiply_to_the_command_probability() -> None:
    scores = torch.tensor([[-1.0, -2.0, -0.5]])  # [1, K]
    choices = [[[3, 4, 2], [3, 5, 2], [6, 2]]]
    options = padded_commands(choices, 4)
    for j in range(3):
        logdist = command_logdist(scores, torch.tensor([j]), temperature=0.7, top_p=1.0)
        logp, entropy = token_factors(logdist, options, options[:, j], vocab=8)
        assert float(logp.sum()) == pytest.approx(float(logdist[0, j]), abs=1e-6)
        assert (entropy >= 0).all()
    # "take" first: the first token's probability is the mass of the commands beginning with 3.
    logdist = command_logdist(scores, torch.tensor([0]), temperature=1.0, top_p=1.0)
    logp, entropy = token_factors(logdist, options, options[:, 0], vocab=8)
    p = torch.softmax(scores[0, :3], dim=0)
    assert math.exp(float(logp[0, 0])) == pytest.approx(float(p[0] + p[1]), abs=1e-6)
    assert math.exp(float(logp[0, 2])) == pytest.approx(1.0)  # only one way to end the command
    assert float(entropy[0, 2]) == pytest.approx(0.0, abs=1e-9)


def test_top_p_drops_unlikely_commands_but_keeps_the_scored_one() -> None:
    scores = torch.tensor([[0.0, -10.0, -10.0]])
    kept = command_logdist(scores, torch.tensor([0]), temperature=1.0, top_p=0.9)
    assert torch.isinf(kept[0, 1:]).all() and float(kept[0, 0]) == pytest.approx(0.0)
    widened = command_logdist(scores, torch.tensor([2]), temperature=1.0, top_p=0.9)
    assert torch.isfinite(widened[0, 2]) and torch.isinf(widened[0, 1])


def test_a_command_choosing_model_draws_whole_commands(model: TinyLM) -> None:
    model.choose_by = "command"
    scores = command_scores(model, PROMPTS, CHOICES).detach()
    greedy = generate(
        model, PROMPTS, uniforms=torch.zeros(2, 6), greedy=[True, True], max_new_tokens=6, temperature=0.7,
        top_p=0.95, stop_ids=(2,), choices=CHOICES,
    )
    assert [s.token_ids for s in greedy] == [CHOICES[r][int(scores[r].argmax())] for r in range(2)]
    seen = set()
    for u in torch.linspace(0.0, 0.999, 40):
        sample = generate(
            model, PROMPTS[:1], uniforms=torch.full((1, 6), float(u)), greedy=[False], max_new_tokens=6,
            temperature=1.0, top_p=1.0, stop_ids=(2,), choices=CHOICES[:1],
        )[0]
        assert sample.token_ids in CHOICES[0]
        j = CHOICES[0].index(sample.token_ids)
        assert sum(sample.logprobs) == pytest.approx(float(torch.log_softmax(scores[0, :3], 0)[j]), abs=1e-5)
        seen.add(j)
    assert seen == {0, 1, 2}  # every command has its interval of uniforms


def test_a_row_without_choices_decodes_freely_beside_command_rows(model: TinyLM) -> None:
    model.choose_by = "command"
    out = generate(
        model, PROMPTS, uniforms=torch.zeros(2, 6), greedy=[True, True], max_new_tokens=6, temperature=0.7,
        top_p=0.95, stop_ids=(2,), choices=[CHOICES[0], []],
    )
    model.choose_by = "token"
    alone = generate(
        model, PROMPTS[1:], uniforms=torch.zeros(1, 6), greedy=[True], max_new_tokens=6, temperature=0.7,
        top_p=0.95, stop_ids=(2,),
    )
    assert out[0].token_ids in CHOICES[0]
    assert out[1].token_ids == alone[0].token_ids


@pytest.mark.parametrize("top_p", [0.95, 1.0])
def test_the_learner_scores_the_chosen_command_as_it_was_drawn(model: TinyLM, top_p: float) -> None:
    model.choose_by = "command"
    drawn = generate(
        model, PROMPTS, uniforms=torch.full((2, 6), 0.6), greedy=[False, False], max_new_tokens=6,
        temperature=0.7, top_p=top_p, stop_ids=(2,), choices=CHOICES,
    )
    scores = model.completion_logprobs(
        PROMPTS, [s.token_ids for s in drawn], temperature=0.7, top_p=top_p, choices=CHOICES
    )
    for row, sample in enumerate(drawn):
        n = len(sample.token_ids)
        torch.testing.assert_close(scores.logprobs[row, :n].detach(), torch.tensor(sample.logprobs), atol=1e-5, rtol=0)
    if top_p == 1.0:  # (at 0.95 the untrained model's nucleus may hold the drawn command alone: log-prob 0)
        scores.logprobs.sum().backward()  # differentiable end to end
        assert model.tok_emb.weight.grad is not None and model.tok_emb.weight.grad.abs().sum() > 0


def test_chosen_factors_pad_past_the_command() -> None:
    scores = torch.tensor([[-1.0, -2.0]])
    logp, entropy = chosen_factors(scores, [[[3, 2], [4, 5, 2]]], torch.tensor([0]), 5, temperature=1.0, top_p=1.0, vocab=8)
    assert logp.shape == (1, 5) and logp[0, 2:].eq(0).all() and entropy[0, 2:].eq(0).all()


def test_repeated_rows_are_encoded_once_and_score_and_train_as_if_apart(model: TinyLM) -> None:
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[0]]
    choices = [CHOICES[0], CHOICES[1], CHOICES[0], CHOICES[0][:2]]  # row 3: same prompt, other commands
    assert distinct_rows(prompts, choices) == ([0, 1, 3], [0, 1, 0, 2])
    weights = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.7, 0.0], [2.0, 1.0, -1.0], [1.5, 0.2, 0.0]])  # [4, 3]

    def scores_and_grad(one_call: bool) -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad()
        if one_call:  # rows 0 and 2 encoded once
            scores = command_scores(model, prompts, choices)  # [4, 3]
        else:  # one call per row
            rows = [command_scores(model, [p], [c]) for p, c in zip(prompts, choices, strict=True)]
            scores = torch.cat([torch.nn.functional.pad(r, (0, 3 - r.shape[1]), value=float("-inf")) for r in rows])
        (scores.masked_fill(torch.isinf(scores), 0.0) * weights).sum().backward()
        return scores.detach(), model.tok_emb.weight.grad.clone()

    together, grad_together = scores_and_grad(one_call=True)
    apart, grad_apart = scores_and_grad(one_call=False)
    torch.testing.assert_close(together, apart, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad_together, grad_apart, atol=1e-5, rtol=1e-4)



def test_a_drawn_command_is_rescored_exactly_under_its_recorded_nucleus_at_every_boundary(model: TinyLM) -> None:
    """The command nucleus recorded at the draw is the one the learner scores under. The learner's forward
    rounds differently from the sampler's (another batch, other shapes: here the weights are nudged by
    1e-6, a rounding-sized change); the top-p rule recomputed there flips at a nucleus boundary, the
    recorded nucleus does not."""
    model.choose_by = "command"
    prompt, options = PROMPTS[0], CHOICES[0]
    learner = copy.deepcopy(model)
    with torch.no_grad():
        learner.ln_f.weight.mul_(1 + 1e-6)
        logp = command_logdist(command_scores(model, [prompt], [options]), torch.tensor([0]), temperature=0.7, top_p=1.0)[0]
    p = logp.exp().sort(descending=True).values  # [K]
    before = (p.cumsum(dim=-1) - p)[1:]  # [K - 1] the nucleus boundaries
    top_ps = {float(x) for x in torch.cat([before, torch.nextafter(before, torch.ones_like(before))])}
    rule_flips = 0
    for top_p in sorted(x for x in top_ps if 0 < x < 1):
        for u in (0.0, 0.5, 0.99):
            drawn = generate(model, [prompt], uniforms=torch.full((1, 6), u), greedy=[False], max_new_tokens=6,
                             temperature=0.7, top_p=top_p, stop_ids=(2,), choices=[options])[0]
            assert drawn.token_ids in options and len(drawn.nucleus) == len(drawn.token_ids)
            n, recorded = len(drawn.token_ids), torch.tensor(drawn.logprobs)
            kwargs = {"temperature": 0.7, "top_p": top_p, "choices": [options]}
            with torch.no_grad():
                scored = learner.completion_logprobs([prompt], [drawn.token_ids], nucleus=[drawn.nucleus], **kwargs)
                by_rule = learner.completion_logprobs([prompt], [drawn.token_ids], **kwargs)
            torch.testing.assert_close(scored.logprobs[0, :n], recorded, atol=1e-5, rtol=0)
            rule_flips += float((by_rule.logprobs[0, :n] - recorded).abs().max()) > 1e-3
    assert rule_flips > 0


def test_a_drawn_command_reports_the_entropy_of_the_command_distribution(model: TinyLM) -> None:
    model.choose_by = "command"
    scores = command_scores(model, PROMPTS, CHOICES).detach()
    samples = generate(
        model, PROMPTS, uniforms=torch.full((2, 6), 0.3), greedy=[False, False], max_new_tokens=6, temperature=0.7,
        top_p=1.0, stop_ids=(2,), choices=CHOICES,
    )
    for r, sample in enumerate(samples):
        p = torch.softmax(scores[r, : len(CHOICES[r])].double() / 0.7, 0)
        assert sample.entropy == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)
