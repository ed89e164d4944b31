"""bench/bench_skip_confident.py records turns as the rollout stage does, through `policy.act` whatever the
backend: the learner, scoring them with the same weights, finds the behaviour log-probs it recorded (ratio 1,
no KL), and the timed update hands back its first step's gradient while still taking the step."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch

from pipeline.config import RunConfig
from pipeline.run import build
from pipeline.run.checks import load
from stages.envs import ENVS

from . import ROOT, bench_module


def _bench():
    return bench_module("bench_skip_confident")


def _torch_tiny(tmp_path: Path) -> RunConfig:
    small = ("{choose_admissible = true, choose_by = \"command\", layers = 1, d_model = 32, heads = 2, max_len = 128, "
             "max_prompt_tokens = 100}")  # the preset's decoding on a small model and short episodes: the same check, ~20x less work
    return load(str(ROOT / "configs" / "learn.toml"), ["pretrain.enabled=false", f'policy.cache_dir="{tmp_path}"', "env.max_steps=8",
                                                       f"policy.options={small}"])


def _hf(tmp_path: Path) -> RunConfig:
    """SmolLM2's preset (LoRA and all) on a tiny random Llama whose word-level tokenizer covers the household game."""
    pytest.importorskip("transformers", reason="the hf backend needs transformers (the `hf` extra)")
    from stages.policy.vllm._make_model import build_tokenizer
    from tests.stages.policy.hf.conftest import tiny_lm

    tokenizer = build_tokenizer(list(ENVS.get("household")(max_steps=30).vocabulary()))
    tiny_lm(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return load(str(ROOT / "configs" / "smollm2-choose.toml"), [f'policy.model="{tmp_path / "model"}"', "env.max_steps=6",
                                                                     "policy.options.max_prompt_tokens=200"])


@pytest.mark.parametrize("preset", [_torch_tiny, _hf], ids=["torch_tiny", "hf"])
def test_the_played_turns_carry_the_log_probs_the_learner_computes(preset, tmp_path):
    cfg = preset(tmp_path)
    suite = build.suite(cfg)
    policy = build.policy(cfg, suite, workers=1)
    bench = _bench()
    played = bench.play_groups(policy, suite, list(suite.tasks("train"))[:1])
    policy.close()
    assert len(played) == 1 and all(len(g.trajectories) == 8 for g in played)
    turns = [u for g in played for t in g.trajectories for u in t.turns]
    assert turns and all(u.choices and u.token_ids in u.choices for u in turns)  # whole admissible commands
    # half the rollouts said to win, whatever the untrained policy did: advantages that are not all zero
    groups = [msgspec.structs.replace(g, trajectories=[msgspec.structs.replace(t, reward=float(k % 2), success=bool(k % 2))
                                                       for k, t in enumerate(g.trajectories)]) for g in played]
    learner = msgspec.structs.replace(cfg.learner, keep_zero_advantage_items=True, minibatch_items=0, max_items=0)
    model = policy.trainable()
    trainer = build.trainer(msgspec.structs.replace(cfg, learner=learner), model)
    torch.set_num_threads(1)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    seconds, stats, gradient = bench.timed_update(trainer, groups)
    assert seconds > 0 and stats["learner/items"] == len(turns)
    assert stats["learner/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["learner/approx_kl"] == pytest.approx(0.0, abs=1e-5)
    assert gradient.numel() == sum(p.numel() for p in before) and gradient.abs().sum() > 0
    after = [p.detach() for p in model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))  # the captured step was still taken
