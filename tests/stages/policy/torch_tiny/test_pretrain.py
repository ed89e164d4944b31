from __future__ import annotations

import pytest
import torch

from stages.policy.base import AgentContext
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
from tests.stages.policy.fake_suite import FindSuite, RecoveringFindSuite

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
    from stages.policy.torch_tiny._pretrain import LabelledEpisode

    task = FindSuite().tasks("train")[0]
    wins = [0, 0, 0, 1, 0, 1, 1, 1, 1]  # groups of 3: none, some, all
    episodes = [LabelledEpisode(task, bool(w), 2, ()) for w in wins]
    assert GroupComposition.of(episodes, 3) == GroupComposition(all_fail=1, mixed=1, all_succeed=1)


def test_noisy_demos_label_every_state_with_the_recovering_expert(fmt: PromptFormat) -> None:
    suite = RecoveringFindSuite(max_steps=12, per_split=24)
    episodes, failed = collect_demos(suite, suite.tasks("train"), fmt, noise=0.5, seed=3)
    assert failed == 0  # the expert recovers from every detour within the step limit
    noisy = [d for e in episodes for d in e if not d.target]
    assert noisy and all(d.completion[-1] == fmt.tokenizer.eos_id for d in noisy)
    env = suite.make()
    for task, episode in zip(suite.tasks("train"), episodes, strict=True):
        obs, history = env.reset(task), []
        for demo in episode:  # replay what was executed; every target is the expert's action there
            assert demo.prompt == fmt.build(AgentContext(task.description, obs.text, obs.admissible, tuple(history)))
            if demo.target:
                assert demo.completion == fmt.completion(suite.expert_action(env))
            action = fmt.tokenizer.decode(demo.completion[:-1])
            history.append((obs.text, action))
            obs = env.step(action).observation
    assert collect_demos(suite, suite.tasks("train"), fmt, noise=0.5, seed=3) == (episodes, failed)


def test_noise_needs_a_recovering_expert(suite: FindSuite, fmt: PromptFormat) -> None:
    with pytest.raises(ValueError, match="pretrain.noise needs a suite whose expert acts from any state"):
        collect_demos(suite, suite.tasks("train")[:2], fmt, noise=0.1)


def test_a_noisy_step_is_context_not_target_and_keeps_the_sequence_packed() -> None:
    a = Demo([1, 5, 11], [20, 2], target=False)  # executed noise: context only
    b = Demo([1, 5, 11, 20, 6, 12], [22, 2])
    packs = pack_episode([a, b])
    assert len(packs) == 1
    assert (packs[0].ids, packs[0].target_pos, packs[0].target_ids, packs[0].steps) == (
        [1, 5, 11, 20, 6, 12, 22], [5, 6], [22, 2], 1
    )
    assert pack_episode([a]) == []  # nothing to learn from a lone noisy step


def test_packed_loss_with_noise_equals_the_loss_of_the_labelled_steps(fmt: PromptFormat, model: TinyLM) -> None:
    suite = RecoveringFindSuite(max_steps=10, per_split=12)
    episodes, _ = collect_demos(suite, suite.tasks("train"), fmt, noise=0.4, seed=1)
    labelled = [d for e in episodes for d in e if d.target]
    packs = [p for e in episodes for p in pack_episode(e)]
    nll, count = packed_nll(model, packs)
    logp, mask, _ = model.completion_logprobs([d.prompt for d in labelled], [d.completion for d in labelled])
    assert count == int(mask.sum())
    torch.testing.assert_close(nll, -(logp * mask).sum(), atol=1e-3, rtol=1e-5)


def test_lockstep_rollouts_label_the_states_the_policy_visits(fmt: PromptFormat, tokenizer) -> None:
    suite = RecoveringFindSuite(max_steps=3, per_split=6)
    model = tiny_model(tokenizer, seed=1)  # untrained: it wanders, the expert labels where it went
    episodes = rollout_lockstep(
        model, fmt, suite, suite.tasks("train"), SamplingConfig(max_new_tokens=6), greedy=False, expert=suite
    )
    env = suite.make()
    for episode in episodes:
        assert len(episode.labelled) == episode.steps
        obs, history = env.reset(episode.task), []
        for demo, action in zip(episode.labelled, episode.actions, strict=True):
            ctx = AgentContext(episode.task.description, obs.text, obs.admissible, tuple(history))
            assert (demo.prompt, demo.completion) == (fmt.build(ctx), fmt.completion(suite.expert_action(env)))
            history.append((obs.text, action))
            obs = env.step(action).observation
