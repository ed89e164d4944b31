"""The hf backend: registered, its section checked without loading anything, built from a model folder."""

from __future__ import annotations

import pytest
import torch

from pipeline.config import PolicySection, PretrainSection
from stages.policy import POLICIES, check_backend
from stages.policy.hf import HfOptions, hf_backend
from stages.policy.hf._learner import ChoiceTrainable
from stages.policy.hf._merge import merged_weights
from stages.policy.hf._server import HfPolicy

from ..fake_suite import FindSuite


def _section(model: str, **options: object) -> PolicySection:
    return PolicySection(backend="hf", model=model, options=dict(options))


def test_the_backend_is_registered_as_hf() -> None:
    assert POLICIES.get("hf") is hf_backend and hf_backend.Options is HfOptions and hf_backend.auto_workers == 1


def test_every_problem_of_a_section_is_listed_at_once(tmp_path) -> None:  # noqa: ANN001
    problems = check_backend(_section(str(tmp_path / "nowhere"), history=-1, colour="red"))
    text = "\n".join(problems)
    assert "colour" in text and "history" in text and "not a model directory" in text
    problems = check_backend(_section("", lora_rank=8, lora_alpha=0.0, lora_target_modules=[]))
    assert any("needs a local Hugging Face model directory" in p for p in problems)
    assert any("lora_alpha" in p for p in problems) and any("lora_target_modules" in p for p in problems)


def test_the_backend_builds_a_policy_and_its_trainable_model_from_a_folder(model_dir) -> None:  # noqa: ANN001
    section = _section(str(model_dir), history=1, instruction="take it")
    policy = hf_backend(section, PretrainSection(), FindSuite(), seed=0)
    assert isinstance(policy, HfPolicy) and policy.prompt.history == 1 and policy.prompt.instruction == "take it"
    assert policy.sampling.temperature == section.temperature and policy.version == 0
    model = hf_backend.trainable(section, PretrainSection(), FindSuite(), seed=0)
    assert isinstance(model, ChoiceTrainable) and all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="history"):
        hf_backend(_section(str(model_dir), history=-2), PretrainSection(), FindSuite(), seed=0)


def test_a_lora_adapter_merges_into_the_base_weights_as_peft_merges_it() -> None:
    peft = pytest.importorskip("peft", reason="LoRA needs peft (the `hf` extra)")
    layer = torch.nn.Sequential()
    layer.add_module("q_proj", torch.nn.Linear(6, 5, bias=False))
    base = {"q_proj.weight": layer.q_proj.weight.detach().clone()}
    original = base["q_proj.weight"].clone()
    model = peft.get_peft_model(torch.nn.ModuleDict({"q_proj": layer.q_proj}), peft.LoraConfig(r=2, lora_alpha=6, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_()
    adapter = dict(peft.get_peft_model_state_dict(model))
    merged = merged_weights(base, adapter, scale=6 / 2)
    x = torch.randn(3, 6)
    torch.testing.assert_close(x @ merged["q_proj.weight"].T, model.base_model.model["q_proj"](x))
    assert torch.equal(base["q_proj.weight"], original)  # the base is untouched: every version merges from it


def test_an_adapter_that_does_not_fit_is_refused() -> None:
    base = {"m.q_proj.weight": torch.zeros(4, 3)}
    a, b = torch.zeros(2, 3), torch.zeros(4, 2)
    with pytest.raises(ValueError, match="does not have"):
        merged_weights(base, {"base_model.model.x.lora_A.weight": a, "base_model.model.x.lora_B.weight": b}, scale=1)
    with pytest.raises(ValueError, match="do not fit"):
        merged_weights(base, {"base_model.model.m.q_proj.lora_A.weight": a.T, "base_model.model.m.q_proj.lora_B.weight": b}, scale=1)
    with pytest.raises(ValueError, match="no lora_A / lora_B partner"):
        merged_weights(base, {"base_model.model.m.q_proj.lora_A.weight": a}, scale=1)
