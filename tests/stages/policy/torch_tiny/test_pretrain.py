from __future__ import annotations

import torch

from stages.policy.torch_tiny import PromptFormat, SamplingConfig, TinyLM
from stages.policy.torch_tiny._pretrain import (
    Demo,
    GroupComposition,
    collect_demos,
    pack_episode,
    packed_nll,
    rollout_lockstep,
    train_bc,
)
from tests.stages.policy.fake_suite import FindSuite

from .conftest import tiny_model


def test_demos_replay_the_expert_with_act_time_prompts(suite: FindSuite, fmt: PromptFormat) -> None:
    tasks = suite.tasks("train")[:5]
    episodes, failed = collect_demos(suite, tasks, fmt)
    assert failed == 0
    assert [len(e) for e in episodes] == [2] * 5
    tok = fmt.tokenizer
    first = episodes[0][0]
    assert first.prompt[-1] == tok.act_id
    assert first.completion == [*tok.encode(suite.expert(tasks[0])[0]), tok.eos_id]


def test_packing_keeps_every_target_and_splits_when_a_prompt_does_not_extend() -> None:
    a = Demo([1, 5, 11], [20, 21, 2])
    b = Demo([1, 5, 11, 20, 21, 6, 12], [22, 2])  # extends a.prompt + a's action
    c = Demo([1, 5, 6, 13], [23, 2])  # the window slid: a new sequence
    packs = pack_episode([a, b, c])
    assert [p.steps for p in packs] == [2, 1]
    assert packs[0].ids == [1, 5, 11, 20, 21, 6, 12, 22]
    assert packs[0].target_pos == [2, 3, 4, 6, 7]
    assert packs[0].target_ids == [20, 21, 2, 22, 2]
    assert (packs[1].ids, packs[1].target_pos, packs[1].target_ids) == ([1, 5, 6, 13, 23], [3, 4], [23, 2])


def test_packed_loss_equals_the_per_step_completion_loss(
    suite: FindSuite, fmt: PromptFormat, model: TinyLM
) -> None:
    episodes, _ = collect_demos(suite, suite.tasks("train")[:6], fmt)
    demos = [d for e in episodes for d in e]
    packs = [p for e in episodes for p in pack_episode(e)]
    assert len(packs) < len(demos)  # packing saved forward passes
    nll, count = packed_nll(model, packs)
    logp, mask, _ = model.completion_logprobs([d.prompt for d in demos], [d.completion for d in demos])
    assert count == int(mask.sum())
    torch.testing.assert_close(nll, -(logp * mask).sum(), atol=1e-3, rtol=1e-5)


def test_behaviour_cloning_learns_the_fake_suite(suite: FindSuite, fmt: PromptFormat, tokenizer) -> None:
    model = tiny_model(tokenizer, seed=0)
    sampling = SamplingConfig(max_new_tokens=8)
    heldout = suite.tasks("heldout_seen")
    before = rollout_lockstep(model, fmt, suite, heldout, sampling, greedy=True)
    episodes, _ = collect_demos(suite, FindSuite(per_split=64).tasks("train"), fmt)
    packs = [p for e in episodes for p in pack_episode(e)]
    losses = train_bc(model, packs, epochs=20, lr=3e-3, batch_size=8, seed=0)
    after = rollout_lockstep(model, fmt, suite, heldout, sampling, greedy=True)
    assert losses[-1] < 0.5 * losses[0]
    assert sum(e.won for e in after) > sum(e.won for e in before) + len(heldout) // 4


def test_max_updates_stops_training_early(suite: FindSuite, fmt: PromptFormat, tokenizer) -> None:
    model = tiny_model(tokenizer)
    episodes, _ = collect_demos(suite, suite.tasks("train"), fmt)
    packs = [p for e in episodes for p in pack_episode(e)]
    start = {k: v.clone() for k, v in model.state_dict().items()}
    losses = train_bc(model, packs, epochs=5, lr=1e-3, batch_size=8, seed=0, max_updates=1)
    assert len(losses) == 1
    assert any(not torch.equal(v, start[k]) for k, v in model.state_dict().items())


def test_group_composition_counts_groups() -> None:
    from stages.policy.torch_tiny._pretrain import Episode

    task = FindSuite().tasks("train")[0]
    wins = [0, 0, 0, 1, 0, 1, 1, 1, 1]  # groups of 3: none, some, all
    episodes = [Episode(task, bool(w), 2, ()) for w in wins]
    assert GroupComposition.of(episodes, 3) == GroupComposition(all_fail=1, mixed=1, all_succeed=1)
