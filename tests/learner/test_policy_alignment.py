"""The learner trains what the policy did: same prompt bytes, same log-probs, and an update points uphill.

Real pieces end to end (household environment, the torch_tiny policy server at T = 0.7 / top-p 0.95, the
rollout stage, the trainer with the real TinyLM), so a mismatch anywhere between sampling and training
(prompt history window, admissible list, truncation of long prompts, padding, the tokens fed back, the
sampling distribution) fails here.
"""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
import torch
import trio

from learner.losses import clipped_ratio_loss
from learner.trainer import Trainer
from pipeline.config import LearnerSection, RolloutSection
from pipeline.messages import GroupResult, TrajectoryStatus
from pipeline.profiling import Profiler
from stages.envs import ENVS
from stages.policy.base import AgentContext
from stages.policy.torch_tiny import (
    ModelConfig,
    PromptFormat,
    SamplingConfig,
    TinyLM,
    TorchTinyPolicy,
    WordTokenizer,
)
from stages.rollout import RolloutStage

TEMPERATURE, TOP_P = 0.7, 0.95


def _policy(show_admissible: bool, choose_admissible: bool, choose_by: str = "token") -> tuple[TorchTinyPolicy, PromptFormat, object]:
    suite = ENVS.get("household")(max_steps=12)
    tokenizer = WordTokenizer.from_vocabulary(suite.vocabulary())
    # A short prompt budget so that history, admissible commands and observations all get truncated.
    fmt = PromptFormat(tokenizer, history=8, show_admissible=show_admissible, max_obs_tokens=64, max_prompt_tokens=90)
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(vocab_size=len(tokenizer), pad_id=tokenizer.pad_id, layers=2, d_model=64, heads=2, max_len=104))
    model.choose_by = choose_by
    sampling = SamplingConfig(
        # Batches close when all 4 rollouts' requests are in (max_batch), so a run is the same whatever the
        # load. Whatever the batches, the learner scores each token under the nucleus recorded with it
        # (`Turn.nucleus`): a token at the nucleus boundary cannot flip between sampling and learning (it
        # did, under load: a 4e-3 log-prob difference).
        temperature=TEMPERATURE, top_p=TOP_P, max_new_tokens=12, max_batch=4, max_wait_ms=200,
        choose_admissible=choose_admissible,
    )
    return TorchTinyPolicy(model, fmt, sampling, seed=5), fmt, suite


async def _roll_out(policy: TorchTinyPolicy, suite, size: int = 4) -> GroupResult:
    task = next(iter(suite.tasks("train")))
    send, recv = trio.open_memory_channel(10_000)
    stage = RolloutStage(suite, policy, {task.task_id: task}, RolloutSection(max_error_rate=1.0), send, profiler=Profiler(enabled=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        result = await stage.run_group(0, task.task_id, size)
        nursery.cancel_scope.cancel()
    recv.close()
    return result


@pytest.fixture(
    scope="module", params=[(False, False), (True, False), (False, True), (False, True, "command")],
    ids=["history", "history+admissible", "choose_admissible", "choose_by_command"],
)
def rolled(request):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    policy, fmt, suite = _policy(*request.param)
    result = trio.run(_roll_out, policy, suite)
    yield policy, fmt, suite, result
    torch.set_num_threads(threads)


def _replayed_contexts(suite, result: GroupResult, trajectory) -> list[AgentContext]:
    """The contexts the agent loop built, rebuilt independently by replaying the recorded actions."""
    task = next(t for t in suite.tasks("train") if t.task_id == result.task_id)
    env = suite.make()
    obs = env.reset(task)
    history: list[tuple[str, str]] = []
    contexts = []
    for turn in trajectory.turns:
        contexts.append(AgentContext(task.description, obs.text, obs.admissible, tuple(history)))
        step = env.step(turn.action)
        history.append((obs.text, turn.action))
        obs = step.observation
    env.close()
    return contexts


def test_the_prompt_the_learner_scores_is_byte_for_byte_the_prompt_the_policy_acted_on(rolled) -> None:
    _, fmt, suite, result = rolled
    turns, truncated = 0, 0
    unbounded = dataclasses.replace(fmt, max_prompt_tokens=10_000)
    for trajectory in result.trajectories:
        assert trajectory.status == TrajectoryStatus.COMPLETE
        wire = msgspec.msgpack.decode(msgspec.msgpack.encode(trajectory), type=type(trajectory))  # as the learner gets it
        for turn, context in zip(wire.turns, _replayed_contexts(suite, result, trajectory), strict=True):
            assert turn.prompt_ids == fmt.build(context)
            turns += 1
            truncated += len(unbounded.build(context)) > fmt.max_prompt_tokens
    assert turns >= 20
    assert truncated >= 5  # the prompt budget was binding: history / admissible list / observation cut


def test_learner_logprobs_equal_the_sampling_logprobs_for_every_token(rolled) -> None:
    policy, _, _, result = rolled
    learner = policy.trainable()
    turns = [t for tr in result.trajectories for t in tr.turns]
    assert all(len(t.nucleus) == len(t.token_ids) for t in turns)  # recorded with every token
    scores = learner.completion_logprobs(
        [t.prompt_ids for t in turns], [t.token_ids for t in turns], temperature=TEMPERATURE, top_p=TOP_P,
        **_choices(turns),
    )
    for i, turn in enumerate(turns):
        n = len(turn.token_ids)
        assert scores.mask[i].sum() == n
        torch.testing.assert_close(scores.logprobs[i, :n].detach(), torch.tensor(turn.logprobs), atol=1e-5, rtol=0)
    if policy.sampling.choose_admissible:  # every action is one of the choices, recorded with it
        assert all(t.admissible and t.choices and t.token_ids in t.choices for t in turns)
    else:  # the fed-back tokens include unstopped completions cut at max_new_tokens and the stop token
        assert any(len(t.token_ids) == 12 for t in turns)


def _choices(turns) -> dict:
    """What sampling recorded for scoring, passed as the trainer passes it: the nucleus, and the choices when
    decoding was constrained."""
    out = {"nucleus": [t.nucleus for t in turns]}
    return out | {"choices": [t.choices for t in turns]} if any(t.choices for t in turns) else out


def test_one_update_raises_the_winner_and_lowers_the_loser(rolled) -> None:
    """Sign test: one small SGD step on one mixed group moves each trajectory's log-prob with its advantage."""
    policy, _, _, result = rolled
    winner, loser = result.trajectories[0], result.trajectories[1]
    group = msgspec.structs.replace(
        result,
        trajectories=[msgspec.structs.replace(winner, reward=1.0, success=True), msgspec.structs.replace(loser, reward=0.0)],
    )
    model = policy.trainable()
    trainer = Trainer(model, LearnerSection(lr=1e-3, max_staleness=10), clipped_ratio_loss, temperature=TEMPERATURE, top_p=TOP_P)
    trainer.optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)

    def total_logprob(trajectory) -> float:
        with torch.no_grad():
            scores = model.completion_logprobs(
                [t.prompt_ids for t in trajectory.turns], [t.token_ids for t in trajectory.turns],
                temperature=TEMPERATURE, top_p=TOP_P, **_choices(trajectory.turns),
            )
        return float(scores.logprobs.sum())

    before = total_logprob(winner), total_logprob(loser)
    _, metrics = trainer.update([group])
    after = total_logprob(winner), total_logprob(loser)
    assert metrics["learner/approx_kl"] == pytest.approx(0.0, abs=1e-6)  # scored as sampled (choices included)
    assert after[0] - after[1] > before[0] - before[1]  # the winner gains on the loser
    if not policy.sampling.choose_admissible:
        # Free generation: the two share few tokens, so each moves with its own advantage. Constrained, they
        # often take the same admissible actions, and pushing the loser's shared turns down may lower the
        # winner's total too (seen: -19.71 -> -19.79) while the difference still moves uphill.
        assert after[0] > before[0]
        assert after[1] < before[1]
