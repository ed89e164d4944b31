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
    from pipeline.run import build
    from stages.policy.vllm import VllmOptions
    from stages.policy.vllm._make_model import BcSettings, ModelShape, make_model

    out = tmp_path_factory.mktemp("models") / "bc"
    cfg = load_config(None, ["env.max_steps=4"])
    report = make_model(
        out, build.suite(cfg), shape=ModelShape(layers=1, hidden=64, heads=2, intermediate=128, max_len=256),
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


def test_finetune_from_a_model_dir_with_lora_saves_a_plain_model_with_merged_weights(
    made: tuple[Path, dict], tmp_path: Path
) -> None:
    pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pipeline.config import load_config
    from pipeline.run import build
    from stages.policy.vllm import VllmOptions
    from stages.policy.vllm._lora import LoraSettings
    from stages.policy.vllm._make_model import BcSettings, finetune_model

    source, _ = made
    out = tmp_path / "bc"
    lora = LoraSettings(4, 8.0, ("q_proj", "v_proj"))
    report = finetune_model(
        source, out, build.suite(load_config(None, ["env.max_steps=4"])),
        bc=BcSettings(demos=4, epochs=1, lr=5e-2, batch_size=4), lora=lora, max_updates=2,
        prompt_options=VllmOptions(max_prompt_tokens=120, max_model_len=256, instruction="act"), seed=0,
    )
    assert report["lora_rank"] == 4 and report["trained_params"] > 0 and len(report["losses"]) == 1
    assert json.loads((out / "rollcut.json").read_text()) == report and (out / "tokenizer.json").is_file()
    before, after = load_file(source / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(before) == set(after)  # a plain model again: no lora_A / lora_B / base_layer names
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(("q_proj" in k or "v_proj" in k) for k in changed)  # only the adapted modules, merged
    AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
