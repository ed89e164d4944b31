from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stages.policy.torch_tiny import TinyLM, generate
from stages.policy.torch_tiny._generate import choose_tokens, generate_uncached
from stages.policy.torch_tiny._server import request_uniforms

PROMPTS = [[1, 5, 11, 12, 13, 7], [1, 5, 14, 7], [1, 5, 15, 16, 17, 18, 19, 7]]


def _run(model: TinyLM, prompts, fn=generate, *, seed=0, greedy=False, temperature=1.0, top_p=1.0):
    uniforms = torch.stack([request_uniforms(seed, i, 6) for i in range(len(prompts))])
    return fn(
        model,
        prompts,
        uniforms=uniforms,
        greedy=[greedy] * len(prompts),
        max_new_tokens=6,
        temperature=temperature,
        top_p=top_p,
        stop_ids=(2, 4),
    )


def test_choose_tokens_greedy_and_top_p() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.9]])
    u = torch.tensor([0.99, 0.99])
    assert choose_tokens(logits, u, torch.tensor([True, True]), temperature=1.0, top_p=1.0).tolist() == [1, 0]
    # A tiny nucleus keeps only the most likely token, whatever the uniform.
    assert choose_tokens(logits, u, torch.tensor([False, False]), temperature=1.0, top_p=1e-6).tolist() == [
        1,
        0,
    ]
    # u near 1 picks the least likely token of the full distribution; u = 0 the most likely.
    assert choose_tokens(logits, u, torch.tensor([False, False]), temperature=1.0, top_p=1.0).tolist() == [
        0,
        1,
    ]
    zero = torch.zeros(2)
    assert choose_tokens(logits, zero, torch.tensor([False, False]), temperature=1.0, top_p=1.0).tolist() == [
        1,
        0,
    ]


def test_choose_tokens_frequencies_follow_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).expand(20000, 3)
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    tokens = choose_tokens(logits, u, torch.zeros(20000, dtype=torch.bool), temperature=1.0, top_p=1.0)
    freq = torch.bincount(tokens, minlength=3).float() / 20000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.015, rtol=0)


def test_sampling_is_reproducible_by_seed(model: TinyLM) -> None:
    a, b, c = _run(model, PROMPTS, seed=7), _run(model, PROMPTS, seed=7), _run(model, PROMPTS, seed=8)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert [s.token_ids for s in a] != [s.token_ids for s in c]


def test_a_row_does_not_depend_on_its_batch(model: TinyLM) -> None:
    together = _run(model, PROMPTS)
    for i, prompt in enumerate(PROMPTS):
        uniforms = request_uniforms(0, i, 6)[None]
        alone = generate(
            model,
            [prompt],
            uniforms=uniforms,
            greedy=[False],
            max_new_tokens=6,
            temperature=1.0,
            top_p=1.0,
            stop_ids=(2, 4),
        )[0]
        assert alone.token_ids == together[i].token_ids
        torch.testing.assert_close(
            torch.tensor(alone.logprobs), torch.tensor(together[i].logprobs), atol=1e-5, rtol=0
        )


def test_kv_cache_generation_equals_uncached(model: TinyLM) -> None:
    for kwargs in ({"greedy": True}, {"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9}):
        cached, uncached = _run(model, PROMPTS, **kwargs), _run(model, PROMPTS, generate_uncached, **kwargs)
        assert [s.token_ids for s in cached] == [s.token_ids for s in uncached]
        for x, y in zip(cached, uncached, strict=True):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=0)


def test_generation_runs_to_max_new_tokens_or_a_stop_token(model: TinyLM) -> None:
    for s in _run(model, PROMPTS, seed=1):
        assert len(s.token_ids) == len(s.logprobs)
        stops = [j for j, t in enumerate(s.token_ids) if t in (2, 4)]
        assert stops == [len(s.token_ids) - 1] if stops else len(s.token_ids) == 6


def test_generation_stops_at_the_first_stop_token(model: TinyLM) -> None:
    with torch.no_grad():  # every final state becomes token 4's embedding (long), so 4 wins the argmax
        model.tok_emb.weight[4] *= 50
        model.ln_f.weight.zero_()
        model.ln_f.bias.copy_(model.tok_emb.weight[4])
    assert [s.token_ids for s in _run(model, PROMPTS, greedy=True)] == [[4], [4], [4]]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.95), (0.5, 0.5)])
def test_ratio_is_one_at_unchanged_weights(model: TinyLM, temperature: float, top_p: float) -> None:
    """The learner's log-probs of sampled completions equal the recorded ones under the distribution
    actually sampled (temperature-scaled, top-p renormalised)."""
    samples = _run(model, PROMPTS, seed=3, temperature=temperature, top_p=top_p)
    logp, mask, _ = model.completion_logprobs(
        PROMPTS, [s.token_ids for s in samples], temperature=temperature, top_p=top_p
    )
    old = torch.zeros_like(logp)
    for i, s in enumerate(samples):
        old[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
    ratio = torch.exp((logp.detach() - old) * mask)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)


def test_recorded_logprobs_are_those_of_the_sampled_distribution_not_temperature_one(model: TinyLM) -> None:
    samples = _run(model, PROMPTS, seed=1, temperature=0.7, top_p=0.95)
    t1, mask, _ = model.completion_logprobs(PROMPTS, [s.token_ids for s in samples])  # T = 1, full vocabulary
    old = torch.zeros_like(t1)
    for i, s in enumerate(samples):
        old[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
    assert float(((old - t1.detach()).abs() * mask).max()) > 1e-3


@pytest.mark.parametrize(("temperature", "top_p", "greedy"), [(1.0, 1.0, False), (0.7, 0.95, False), (0.7, 0.95, True)])
def test_constrained_decoding_emits_only_choices_and_the_learner_scores_it_exactly(
    model: TinyLM, temperature: float, top_p: float, greedy: bool
) -> None:
    choices = [[[9, 10, 2], [9, 11, 12, 2], [13, 2]], [[9, 10, 2]], []]  # the last prompt decodes freely
    prompts = PROMPTS * 6
    uniforms = torch.stack([request_uniforms(3, i, 6) for i in range(len(prompts))])
    samples = generate(
        model, prompts, uniforms=uniforms, greedy=[greedy] * len(prompts), max_new_tokens=6,
        temperature=temperature, top_p=top_p, stop_ids=(2, 4), choices=choices * 6,
    )
    for i, s in enumerate(samples):
        if choices[i % 3]:
            assert s.token_ids in choices[i % 3]
    assert len({tuple(s.token_ids) for s in samples[::3]}) >= (1 if greedy else 2)  # sampled, not fixed
    scored = model.completion_logprobs(
        prompts, [s.token_ids for s in samples], temperature=temperature, top_p=top_p, choices=choices * 6
    )
    recorded = torch.zeros_like(scored.logprobs)
    for i, s in enumerate(samples):
        recorded[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
    torch.testing.assert_close(scored.logprobs, recorded, atol=1e-5, rtol=0)
    assert torch.isfinite(scored.entropy).all()
    # Scoring without the constraint gives other log-probs: the mask is what makes them agree.
    free = model.completion_logprobs(prompts, [s.token_ids for s in samples], temperature=temperature, top_p=top_p)
    assert not torch.allclose(free.logprobs[0::3], recorded[0::3], atol=1e-3)
    # The single-choice prompt is certain: every token has log-prob 0 under the constraint.
    assert float(scored.logprobs[1::3].detach().abs().max()) < 1e-6


def _boundary_top_ps(logits: torch.Tensor, temperature: float) -> list[float]:
    """top_p values at each rank's nucleus boundary (the mass before it, and the next float up), where a
    last-bit difference between two forwards decides whether the top-p rule keeps that token."""
    p = F.log_softmax(logits.float() / temperature, dim=-1).exp().sort(descending=True).values  # [V]
    before = (p.cumsum(dim=-1) - p)[1:]  # [V - 1]
    up = torch.nextafter(before, torch.ones_like(before))
    return sorted({float(x) for x in torch.cat([before, up]) if 0 < float(x) < 1})


def test_a_sampled_completion_is_rescored_exactly_alone_and_beside_longer_turns_at_every_nucleus_boundary(
    model: TinyLM,
) -> None:
    """Sampling's forward (KV-cached, left-padded) and the learner's (full, right-padded, beside longer turns)
    differ in the last bits; at a nucleus boundary that flipped the top-p rule (a 4e-3 log-prob difference in
    a full-suite run). Scored under the nucleus recorded with each token, the ratio is 1 whatever the batch."""
    prompt, temperature = PROMPTS[0], 0.7
    longer = [(list(range(1, 20)), [3, 5, 6, 7, 8, 9]), (list(range(3, 30)), [10, 11, 2])]
    with torch.no_grad():
        first = model(torch.tensor([prompt]))[0, -1]  # [V] the logits of the first sampled token
    rule_flips = 0
    for top_p in _boundary_top_ps(first, temperature):
        sample = _run(model, [prompt], temperature=temperature, top_p=top_p)[0]
        assert len(sample.nucleus) == len(sample.token_ids)
        recorded = torch.tensor(sample.logprobs)
        n = len(sample.token_ids)
        with torch.no_grad():
            for batch in ([(prompt, sample.token_ids)], [*longer, (prompt, sample.token_ids)]):
                prompts, completions = [p for p, _ in batch], [c for _, c in batch]
                nuclei = [[]] * (len(batch) - 1) + [sample.nucleus]  # the longer turns: the top-p rule
                scored = model.completion_logprobs(prompts, completions, temperature=temperature, top_p=top_p, nucleus=nuclei)
                torch.testing.assert_close(scored.logprobs[-1, :n], recorded, atol=1e-5, rtol=0)
                by_rule = model.completion_logprobs(prompts, completions, temperature=temperature, top_p=top_p)
                rule_flips += float((by_rule.logprobs[-1, :n] - recorded).abs().max()) > 1e-3
    assert rule_flips > 0  # the top-p rule recomputed by the learner did flip at some boundary here


def test_a_decoded_action_reports_its_mean_token_entropy(model: TinyLM) -> None:
    from stages.policy.sampling import sampling_entropy

    (sample,) = _run(model, PROMPTS[:1], temperature=0.7, top_p=1.0)
    # recompute each generated token's distribution with the uncached reference and average its entropy
    ids = list(PROMPTS[0])
    entropies = []
    for token in sample.token_ids:
        logits = model.logits(model.hidden(torch.tensor([ids]), torch.arange(len(ids))[None], torch.ones(1, len(ids), dtype=torch.bool))[:, -1])
        entropies.append(float(sampling_entropy(logits.float(), temperature=0.7, top_p=1.0)[0]))
        ids.append(token)
    assert sample.entropy == pytest.approx(sum(entropies) / len(entropies), abs=1e-4)
    assert sample.entropy > 0
