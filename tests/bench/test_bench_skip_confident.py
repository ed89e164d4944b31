"""bench/bench_skip_confident.py records turns as the rollout stage does: the learner, scoring them with the
same weights, finds the behaviour log-probs it recorded (ratio 1, no KL)."""

from __future__ import annotations

import msgspec
import pytest
import torch

from learner.losses import clipped_ratio_loss
from learner.trainer import Trainer
from pipeline.run import build
from pipeline.run.checks import load

from . import ROOT, bench_module


def _bench():
    return bench_module("bench_skip_confident")


def test_the_played_turns_carry_the_log_probs_the_learner_computes(tmp_path):
    small = ("{choose_admissible = true, choose_by = \"command\", layers = 1, d_model = 32, heads = 2, max_len = 128, "
             "max_prompt_tokens = 100}")  # the preset's decoding on a small model and short episodes: the same check, ~20x less work
    cfg = load(str(ROOT / "configs" / "learn.toml"), ["pretrain.enabled=false", f'policy.cache_dir="{tmp_path}"', "env.max_steps=8",
                                                      f"policy.options={small}"])
    assert cfg.policy.options["choose_by"] == "command" and cfg.policy.options["layers"] == 1
    suite = build.suite(cfg)
    policy = build.policy(cfg, suite, workers=1)
    groups = _bench().play_groups(policy, suite, list(suite.tasks("train"))[:1], seed=0)
    assert len(groups) == 1 and all(len(g.trajectories) == 8 for g in groups)
    turns = [u for g in groups for t in g.trajectories for u in t.turns]
    assert turns and all(u.choices and u.token_ids in u.choices for u in turns)  # whole admissible commands
    learner = msgspec.structs.replace(cfg.learner, keep_zero_advantage_items=True, minibatch_items=0)
    trainer = Trainer(policy.model.requires_grad_(True), learner, clipped_ratio_loss,
                      temperature=policy.sampling.temperature, top_p=policy.sampling.top_p)
    torch.set_num_threads(1)
    _, stats = trainer.update(groups)
    assert stats["learner/items"] == len(turns)
    assert stats["learner/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["learner/approx_kl"] == pytest.approx(0.0, abs=1e-5)
