"""make-model's greedy held-out evaluation: left padding changes nothing; the report holds the success."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stages.policy.vllm._evaluate import left_padded


def test_left_padding_right_aligns_every_prompt() -> None:
    ids, mask = left_padded([[5, 6, 7], [8]], pad_id=0)  # [2, 3]
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    pytest.importorskip("transformers", reason="make-model needs transformers (vllm environment)")
    from pipeline.config import load_config
    from pipeline.job import build_suite
    from stages.policy.vllm import VllmOptions
    from stages.policy.vllm._make_model import BcSettings, ModelShape, make_model

    out = tmp_path_factory.mktemp("models") / "bc"
    cfg = load_config(None, ["env.max_steps=4"])
    report = make_model(
        out, build_suite(cfg), shape=ModelShape(layers=1, hidden=64, heads=2, intermediate=128, max_len=256),
        bc=BcSettings(demos=6, epochs=1, lr=3e-3, batch_size=8, noise=0.15),
        prompt_options=VllmOptions(max_prompt_tokens=120, max_model_len=256), eval_tasks=3, seed=0,
    )
    return out, report


def test_make_model_clones_evaluates_and_saves_its_report(made: tuple[Path, dict]) -> None:
    out, report = made
    assert json.loads((out / "rollcut.json").read_text()) == report
    assert report["noise"] == 0.15 and report["sequences"] > 0 and len(report["losses"]) == 1
    for split in ("heldout_seen", "heldout_unseen"):
        assert 0.0 <= report[f"success_{split}"] <= 1.0
    assert report["eval_tasks"] == 3 and report["eval_s"] >= 0 and (out / "tokenizer.json").is_file()


def test_a_batch_decodes_as_each_prompt_alone(made: tuple[Path, dict]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stages.policy.base import AgentContext
    from stages.policy.vllm._evaluate import greedy_actions
    from stages.policy.vllm._prompt import ChatPrompt

    out, _ = made
    lm = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    prompt = ChatPrompt(AutoTokenizer.from_pretrained(out), max_prompt_tokens=120)
    prompts = [prompt.build(AgentContext("put a mug in cabinet 1", obs, ("look",))) for obs in
               ("You are in the middle of a room.", "You see a mug 1 and a cabinet 1 and a drawer 2.")]
    assert len(prompts[0]) != len(prompts[1])  # so the batch really pads
    together = greedy_actions(lm, prompt, prompts, max_new_tokens=6)
    alone = [greedy_actions(lm, prompt, [p], max_new_tokens=6)[0] for p in prompts]
    assert together == alone
