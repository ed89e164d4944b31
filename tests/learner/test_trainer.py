"""The GRPO update on a fixed batch: loss goes down, parameters move, the figures and stops act."""

import copy

import pytest
import torch

from learner.items import build_items
from learner.losses import clipped_ratio_loss
from learner.trainer import Trainer, UpdateStopped, published_weights
from pipeline.config import LearnerSection
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus, Turn
from stages.policy.sampling import nucleus_sizes, sampled_logprobs

from .toy_model import BigramModel
from .toy_model import toy_group as _group


def test_updates_lower_the_loss_and_change_the_parameters():
    model = BigramModel()
    cfg = LearnerSection(lr=0.05, max_items=0, micro_batch=3)
    trainer = Trainer(model, cfg, clipped_ratio_loss)
    batch = [_group(model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    losses = []
    for _ in range(5):
        state, stats = trainer.update(batch)
        losses.append(stats["learner/loss"])
    assert losses[-1] < losses[0]
    assert any(not torch.equal(before[k], state[k]) for k in before)
    # the winning completion became more likely
    with torch.no_grad():
        now = model.completion_logprobs([[1, 2]], [[3, 4, 5]]).logprobs
    assert float(now.sum()) > float(sum(batch[0].trajectories[0].turns[0].logprobs))


def test_published_state_is_a_detached_copy():
    model = BigramModel()
    trainer = Trainer(model, LearnerSection(lr=0.05), clipped_ratio_loss)
    state, _ = trainer.update([_group(model, 0, [1.0, 0.0])])
    trainer.update([_group(model, 1, [1.0, 0.0])])
    assert not torch.equal(state["table.weight"], model.state_dict()["table.weight"])


def test_turns_older_than_the_staleness_bound_are_dropped_and_counted():
    model = BigramModel()
    groups = [_group(model, 0, [1.0, 0.0], version=3), _group(model, 1, [1.0, 0.0], version=5)]
    items, counts = build_items(groups, eps=1e-6, learner_version=5, max_staleness=1)
    assert counts.dropped_stale == 2
    assert [it.lag for it in items] == [0, 0]
    assert (counts.stale_tokens, counts.stale_zero_variance) == (3 + 2, 0)  # a win's 3 tokens, a failure's 2
    flat = _group(model, 3, [1.0, 1.0], version=3)  # zero variance: its turns are items only when zero advantage is kept
    _, counts = build_items([*groups, flat], eps=1e-6, learner_version=5, max_staleness=1, keep_zero_advantage=True)
    assert (counts.dropped_stale, counts.stale_tokens) == (4, 5 + 6)
    assert (counts.stale_zero_variance, counts.stale_tokens_zero_variance) == (2, 6)
    trainer = Trainer(model, LearnerSection(lr=0.01, max_staleness=1), clipped_ratio_loss)
    _, stats = trainer.update(groups, version=5)
    assert stats["learner/items_dropped_stale"] == 2.0
    assert stats["learner/tokens_dropped_stale"] == 5.0 and stats["learner/items_dropped_stale_zero_variance"] == 0.0
    assert stats["staleness_lag_max"] == 0.0
    _, stats = trainer.update([_group(model, 2, [1.0, 0.0], version=4)], version=5)
    assert stats["staleness_lag_max"] == 1.0 and stats["learner/items"] == 2.0


def _one_step_grads(micro_batch: int, aggregation: str):
    model = BigramModel(seed=3)
    trainer = Trainer(model, LearnerSection(lr=1e-3, micro_batch=micro_batch, aggregation=aggregation), clipped_ratio_loss)
    batch = [
        _group(model, 0, [1.0, 0.0, 0.0], completion=(3, 4, 5, 6, 7)),
        _group(model, 1, [0.0, 1.0, 1.0], completion=(8,)),
    ]
    return _first_step_grad(trainer, model, batch)


def _first_step_grad(trainer, model, batch):
    """The gradient the update's (only) optimizer step applies, and the update's stats."""
    captured = {}
    original = trainer.optimizer.step

    def capture():
        captured["grad"] = model.table.weight.grad.clone()
        original()

    trainer.optimizer.step = capture
    _, stats = trainer.update(batch)
    return captured["grad"], stats


@pytest.mark.parametrize("aggregation", ["token_mean", "turn_mean", "trajectory_mean", "constant"])
def test_micro_batching_does_not_change_the_normalisation(aggregation):
    whole, _ = _one_step_grads(64, aggregation)
    split, _ = _one_step_grads(1, aggregation)
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-7)


def test_max_kl_stops_the_epochs_early():
    model = BigramModel()
    batch = [_group(model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]
    _, free = Trainer(model, LearnerSection(lr=0.5, epochs=4), clipped_ratio_loss).update(batch)
    assert free["learner/epochs"] == 4.0
    model = BigramModel()
    batch = [_group(model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]
    _, capped = Trainer(model, LearnerSection(lr=0.5, epochs=4, max_kl=1e-9), clipped_ratio_loss).update(batch)
    assert capped["learner/epochs"] == 2.0  # epoch 1 is on-policy (KL 0); epoch 2 sees the moved weights
    assert capped["learner/kl_stopped"] == 1.0 and free["learner/kl_stopped"] == 0.0


def _kl_capped_update(**cfg):
    model = BigramModel()
    batch = [_group(model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]  # 12 one-turn items
    return Trainer(model, LearnerSection(lr=0.5, max_items=0, minibatch_items=3, **cfg), clipped_ratio_loss).update(batch)


def test_a_step_kl_stop_acts_inside_a_single_epoch():
    _, free = _kl_capped_update(epochs=1)
    assert free["learner/optimizer_steps"] == 4.0 and free["learner/kl_stopped"] == 0.0
    _, per_epoch = _kl_capped_update(epochs=1, max_kl=1e-9)  # checked after the only epoch: too late to act
    assert per_epoch["learner/optimizer_steps"] == 4.0 and per_epoch["learner/kl_stopped"] == 0.0
    _, per_step = _kl_capped_update(epochs=1, max_kl=1e-9, kl_stop="step")
    assert per_step["learner/optimizer_steps"] == 1.0  # mini-batch 1 is on-policy; mini-batch 2 sees moved weights
    assert per_step["learner/kl_stopped"] == 1.0 and per_step["learner/epochs"] == 1.0


def test_a_step_kl_stop_leaves_the_weights_alone_when_the_first_step_is_over():
    model = BigramModel()
    batch = [_group(model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]
    trainer = Trainer(model, LearnerSection(lr=0.5, max_items=0, max_kl=1e-9, kl_stop="step"), clipped_ratio_loss)
    _, first = trainer.update(batch)  # one on-policy step: the weights move away from the batch's behaviour log-probs
    assert first["learner/optimizer_steps"] == 1.0
    moved = {k: v.clone() for k, v in model.state_dict().items()}
    state, stats = trainer.update(batch)  # the same (now stale) batch: over the limit before any step
    assert stats["learner/optimizer_steps"] == 0.0 and stats["learner/grad_norm"] == 0.0
    assert all(torch.equal(moved[k], state[k]) for k in moved)


def test_update_reports_the_figures_that_show_trouble_coming():
    model = BigramModel()
    _, stats = Trainer(model, LearnerSection(lr=0.05), clipped_ratio_loss).update([_group(model, 0, [1.0, 0.0])])
    for key in ("learner/ratio_mean", "learner/clip_fraction", "learner/approx_kl", "learner/entropy",
                "learner/invalid_action_fraction", "learner/batch_success", "staleness_lag_mean"):
        assert key in stats
    assert stats["learner/ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # first epoch, unchanged weights
    assert stats["learner/entropy"] > 0


def test_update_reports_the_share_of_distinct_prompts():
    model = BigramModel()
    trainer = Trainer(model, LearnerSection(lr=0.05, max_items=0), clipped_ratio_loss)
    _, stats = trainer.update([_group(model, 0, [1.0, 0.0, 0.0, 1.0])])  # four turns, one prompt
    assert stats["learner/distinct_prompt_fraction"] == pytest.approx(0.25)


def test_ema_publishes_a_moving_average_of_the_iterates_and_checkpoints_it():
    model = BigramModel()
    start = model.state_dict()["table.weight"].clone()
    trainer = Trainer(model, LearnerSection(lr=0.05, max_items=0, ema=0.75), clipped_ratio_loss)
    published, _ = trainer.update([_group(model, 0, [1.0, 0.0])])
    first = model.state_dict()["table.weight"].clone()
    assert not torch.equal(first, start)
    torch.testing.assert_close(published["table.weight"], 0.75 * start + 0.25 * first)
    published, _ = trainer.update([_group(model, 1, [1.0, 0.0])])
    second = model.state_dict()["table.weight"]
    torch.testing.assert_close(published["table.weight"], 0.75 * (0.75 * start + 0.25 * first) + 0.25 * second)

    saved = trainer.state_dict()
    assert torch.equal(published_weights(saved)["table.weight"], published["table.weight"])
    fresh = Trainer(BigramModel(), LearnerSection(lr=0.05, max_items=0, ema=0.75), clipped_ratio_loss)
    fresh.load_state_dict(saved)  # a resumed run goes on averaging from the same point
    assert torch.equal(fresh.published()["table.weight"], published["table.weight"])


def test_without_ema_the_latest_iterate_is_published():
    model = BigramModel()
    trainer = Trainer(model, LearnerSection(lr=0.05, max_items=0), clipped_ratio_loss)
    published, _ = trainer.update([_group(model, 0, [1.0, 0.0])])
    assert torch.equal(published["table.weight"], model.state_dict()["table.weight"])
    assert torch.equal(published_weights(trainer.state_dict())["table.weight"], published["table.weight"])


def test_a_resumed_trainer_keeps_the_warm_start_as_its_kl_reference():
    model = BigramModel()
    warm_start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = LearnerSection(lr=0.05, max_items=0, kl_coef=0.1)
    trainer = Trainer(model, cfg, clipped_ratio_loss)
    trainer.update([_group(model, 0, [1.0, 0.0])])
    saved = trainer.state_dict()
    assert not torch.equal(saved["model"]["table.weight"], warm_start["table.weight"])

    resumed_model = BigramModel()
    resumed_model.load_state_dict(saved["model"])  # as a resume does: the policy holds the checkpoint first
    resumed = Trainer(resumed_model, cfg, clipped_ratio_loss)
    resumed.load_state_dict(saved)
    assert torch.equal(resumed.reference.state_dict()["table.weight"], warm_start["table.weight"])


def _with_logprobs(group, logprob):
    """`group` as if its policy had acted with per-token log-prob `logprob` (p = e^logprob)."""
    trajectories = [
        Trajectory(rollout_index=t.rollout_index, reward=t.reward, success=t.success, status=t.status,
                   turns=[Turn(prompt_ids=u.prompt_ids, token_ids=u.token_ids, logprobs=[logprob] * len(u.token_ids),
                               action=u.action, policy_version=u.policy_version) for u in t.turns])
        for t in group.trajectories
    ]
    return GroupResult(group_id=group.group_id, task_id=group.task_id, trajectories=trajectories, cut=False)


def _first_step(skip_confident: float):
    model = BigramModel(seed=5)
    cfg = LearnerSection(lr=1e-3, skip_confident=skip_confident, keep_zero_advantage_items=True, micro_batch=2)
    trainer = Trainer(model, cfg, clipped_ratio_loss)
    forwarded: list[list[int]] = []
    score = model.completion_logprobs

    def spy(prompts, completions, **kw):
        forwarded.extend(completions)
        return score(prompts, completions, **kw)

    model.completion_logprobs = spy
    # a mixed group the policy was unsure of, and an all-succeed group it acted in with p = 0.9995 per token:
    # zero advantage, so it adds no gradient, but its trajectories count in the trajectory_mean weights
    unsure = _group(model, 0, [1.0, 0.0, 0.0])
    sure = _with_logprobs(_group(model, 1, [1.0, 1.0], completion=(9, 10)), -5e-4)
    forwarded.clear()  # what building the groups scored
    grad, stats = _first_step_grad(trainer, model, [unsure, sure])
    return grad, stats, forwarded


def test_confident_turns_are_skipped_and_the_rest_keep_their_weights():
    every, every_stats, every_forwarded = _first_step(0.0)
    skipping, stats, forwarded = _first_step(0.99)
    assert [9, 10] in every_forwarded and [9, 10] not in forwarded  # never scored when skipped
    assert every_stats["learner/skipped_confident"] == 0.0
    assert stats["learner/skipped_confident"] == pytest.approx(2 / 5)
    torch.testing.assert_close(skipping, every, rtol=1e-5, atol=1e-8)  # the unsure group's weights are unchanged
    assert float(skipping.abs().sum()) > 0


def test_skip_confident_must_be_a_probability_below_one():
    assert "learner.skip_confident must be in [0, 1)" in LearnerSection(skip_confident=1.0).problems()


def test_each_turn_is_scored_under_the_nucleus_its_sampling_recorded():
    """The sampler's forward and the learner's round differently (other batch, other shapes; here the
    sampler's weights sit 2e-6 away). At a top_p where that decides whether the top-p rule keeps a
    boundary token, the learner scores under the nucleus sizes the turn recorded: the ratio stays 1."""
    model = BigramModel(seed=2)
    sampler = copy.deepcopy(model)
    with torch.no_grad():
        sampler.table.weight.add_(2e-6)
        sampler.table.weight[:, 0].sub_(4e-6)
    temperature, prompt, completion = 0.7, [1, 2], [3, 4, 5]
    previous = torch.tensor([prompt[-1], *completion[:-1]])  # [T]

    def before(m):  # [T, V] mass of the tokens more likely than each rank, as the top-p rule computes it
        with torch.no_grad():
            p = torch.log_softmax(m.table(previous) / temperature, dim=-1).exp().sort(dim=-1, descending=True).values
        return p.cumsum(dim=-1) - p

    sampled, learned = before(sampler), before(model)
    top_p = float(torch.maximum(sampled, learned)[(sampled != learned) & (sampled > 0.5) & (sampled < 0.99)][0])  # the rule keeps a token for one only
    with torch.no_grad():
        logits = sampler.table(previous)  # [T, V]
        nucleus = nucleus_sizes(logits, temperature=temperature, top_p=top_p)  # [T]
        old = sampled_logprobs(logits, torch.tensor(completion), temperature=temperature, top_p=top_p, nucleus=nucleus)
    turn = Turn(prompt_ids=prompt, token_ids=completion, logprobs=old.tolist(), action="a", policy_version=0,
                nucleus=nucleus.tolist())
    group = GroupResult(group_id=0, task_id="t", cut=False, trajectories=[
        Trajectory(rollout_index=i, turns=[turn], reward=float(i), success=bool(i), status=TrajectoryStatus.COMPLETE)
        for i in range(2)
    ])
    cfg = LearnerSection(lr=0.05, max_items=0)
    _, stats = Trainer(model, cfg, clipped_ratio_loss, temperature=temperature, top_p=top_p).update([group])
    assert stats["learner/approx_kl"] < 1e-10 and stats["learner/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    by_rule = model.completion_logprobs([prompt], [completion], temperature=temperature, top_p=top_p).logprobs[0]
    assert float((by_rule.detach() - old).abs().max()) > 1e-3  # what scoring by the top-p rule would have given


def _long_and_short_trajectory_group():
    """One group: a 30-turn failure and a 7-turn success, every turn with its own prompt."""
    def trajectory(index, turns, reward):
        return Trajectory(rollout_index=index, reward=reward, success=reward > 0, status=TrajectoryStatus.COMPLETE, turns=[
            Turn(prompt_ids=[1, index, t // 16, t % 16], token_ids=[3, 4], logprobs=[-1.0, -1.0], action="a", policy_version=0)
            for t in range(turns)
        ])
    return GroupResult(group_id=0, task_id="t", cut=False, trajectories=[trajectory(0, 30, 0.0), trajectory(1, 7, 1.0)])


def _weight_of(sign: float):
    """A loss whose per-token term is 1 for the items whose advantage has `sign`, 0 for the others: a step's
    loss is then the aggregation weight those items carry in it (weights are per token)."""
    def loss(new, old, advantages, mask, *, clip_eps):
        rows = (advantages * sign > 0).float()[:, None]  # [c, 1]
        return new * 0 + rows * mask
    return loss


def test_trajectory_mean_gives_a_long_and_a_short_trajectory_equal_weight_across_mini_batches():
    """Weights are computed once over the update's items and sliced per mini-batch: a 30-turn trajectory
    spread over many optimizer steps does not regain the weight a per-step normaliser would give it."""
    totals = {}
    for sign in (-1.0, 1.0):  # the 30-turn failure, the 7-turn success
        cfg = LearnerSection(lr=0.05, max_items=0, minibatch_items=4, aggregation="trajectory_mean")
        _, stats = Trainer(BigramModel(), cfg, _weight_of(sign)).update([_long_and_short_trajectory_group()])
        assert stats["learner/optimizer_steps"] == 10.0  # 37 items in mini-batches of 4
        totals[sign] = stats["learner/loss"] * stats["learner/optimizer_steps"]
    assert totals[-1.0] == pytest.approx(totals[1.0], rel=1e-6)
    assert totals[-1.0] + totals[1.0] == pytest.approx(10.0, rel=1e-6)  # each step weighs 1 on average


def test_turns_beyond_max_items_are_counted():
    model = BigramModel()
    batch = [_group(model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]  # 12 one-turn items
    _, stats = Trainer(model, LearnerSection(lr=0.05, max_items=5), clipped_ratio_loss).update(batch)
    assert stats["learner/items"] == 5.0 and stats["learner/items_beyond_max"] == 7.0
    _, stats = Trainer(model, LearnerSection(lr=0.05, max_items=0), clipped_ratio_loss).update(batch)
    assert stats["learner/items"] == 12.0 and stats["learner/items_beyond_max"] == 0.0


def test_a_stopped_trainer_ends_its_update_at_the_next_micro_batch():
    """`Trainer.stop()` (the learner stage, its phase ended during an update) ends the update between two
    micro-batches: here from inside the model's forward, as another thread would while the first one runs."""
    model = BigramModel()
    trainer = Trainer(model, LearnerSection(lr=0.05, max_items=0, micro_batch=2), clipped_ratio_loss)
    batch = [_group(model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]  # 12 items: 6 micro-batches
    forwards = []
    score = model.completion_logprobs

    def scored(*args, **kwargs):
        forwards.append(1)
        trainer.stop()
        return score(*args, **kwargs)

    model.completion_logprobs = scored
    with pytest.raises(UpdateStopped, match="stopped after 2 of 12 items"):
        trainer.update(batch)
    assert len(forwards) == 1
    with pytest.raises(UpdateStopped):  # and the next update does not start
        trainer.update(batch)
