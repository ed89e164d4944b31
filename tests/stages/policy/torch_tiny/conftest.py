"""Tiny model, tokenizer and prompt format over the fake find-suite: every test runs in milliseconds."""

from __future__ import annotations

import pytest
import torch

from stages.policy.torch_tiny import (
    ModelConfig,
    PromptFormat,
    SamplingConfig,
    TinyLM,
    TorchTinyPolicy,
    WordTokenizer,
)
from tests.stages.policy.fake_suite import FindSuite


@pytest.fixture
def suite() -> FindSuite:
    return FindSuite(per_split=16)


@pytest.fixture
def tokenizer(suite: FindSuite) -> WordTokenizer:
    return WordTokenizer.from_vocabulary(suite.vocabulary())


@pytest.fixture
def fmt(tokenizer: WordTokenizer) -> PromptFormat:
    return PromptFormat(tokenizer, history=2, max_prompt_tokens=48)


def tiny_model(tokenizer: WordTokenizer, seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=len(tokenizer), pad_id=tokenizer.pad_id, layers=2, d_model=32, heads=2, max_len=64
    )
    return TinyLM(cfg)


@pytest.fixture
def model(tokenizer: WordTokenizer) -> TinyLM:
    return tiny_model(tokenizer)


def make_policy(model: TinyLM, fmt: PromptFormat, *, seed: int = 0, **sampling: float) -> TorchTinyPolicy:
    cfg = SamplingConfig(**{"max_new_tokens": 8, "max_batch": 8, "max_wait_ms": 1.0, **sampling})
    return TorchTinyPolicy(model, fmt, cfg, seed=seed)
