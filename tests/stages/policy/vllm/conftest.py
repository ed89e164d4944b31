"""The small local Llama the vLLM tests serve (built once per session by make-model, untrained)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipeline.config import load_config
    from pipeline.run import build
    from stages.policy.vllm import VllmOptions
    from stages.policy.vllm._make_model import UNTRAINED, ModelShape, make_model

    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    make_model(out, build.suite(load_config(None, [])), shape=ModelShape(layers=2, hidden=64, heads=2, intermediate=128),
               bc=UNTRAINED, prompt_options=VllmOptions(), seed=0)
    return out
