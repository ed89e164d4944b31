"""A tiny randomly initialised Llama and a word-level chat tokenizer, built in the test (no downloads).

transformers is imported by the fixtures only, so this file imports without it; the modules that need it
skip themselves (`pytest.importorskip`), which a conftest cannot do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from stages.policy.base import AgentContext
from stages.policy.vllm._prompt import ChatPrompt

from ..fake_suite import FindSuite

SKIP_REASON = "the hf backend needs transformers (the `hf` extra)"

COMMANDS = ("go to shelf 1", "go to shelf 2", "go to table 1", "go to table 2", "go to drawer 1", "take key from shelf 1")
CONTEXTS = [
    AgentContext(f"take the {obj}", f"you are in a room. the {obj} is on shelf {i % 2 + 1}.",
                 (COMMANDS[i % 3:] + COMMANDS[: i % 3])[: 2 + i % 5], history=(("you are in a room.", "look"),) * (i % 3))
    for i, obj in enumerate(["key", "cup", "book", "apple"] * 2)
]
"""Contexts with different prompt lengths and 2-6 commands each."""


def tiny_lm(tokenizer: Any, *, seed: int = 0) -> Any:
    transformers = pytest.importorskip("transformers", reason=SKIP_REASON)
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return transformers.LlamaForCausalLM(config).float().eval()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    pytest.importorskip("transformers", reason=SKIP_REASON)
    from stages.policy.vllm._make_model import build_tokenizer

    return build_tokenizer(FindSuite().vocabulary())


@pytest.fixture
def prompt(tokenizer: Any) -> ChatPrompt:
    return ChatPrompt(tokenizer, history=2, max_prompt_tokens=200, instruction="take the thing")


@pytest.fixture
def lm(tokenizer: Any) -> Any:
    return tiny_lm(tokenizer)


@pytest.fixture(scope="session")
def model_dir(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_lm` saved as a model directory, as import-model writes one."""
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    tiny_lm(tokenizer).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
