"""ChatPrompt: plain-text prompts without a chat template, budget trimming, completion and stop ids."""

from __future__ import annotations

import pytest

from stages.policy.base import AgentContext
from stages.policy.vllm._prompt import ChatPrompt

from .fakes import WordTok

HISTORY = tuple((f"room {i} is here", f"go to {i}") for i in range(6))
CTX = AgentContext("find the mug", "you see a mug 1 and a cup 2", ("take mug 1",), HISTORY)


def test_plain_prompt_lists_task_history_and_observation_in_order() -> None:
    tok = WordTok()
    prompt = ChatPrompt(tok, history=2, max_prompt_tokens=1000)
    words = [tok.words[i] for i in prompt.build(CTX)]
    text = " ".join(words)
    assert text.startswith("Task: find the mug Observation: room 4 is here Action: go to 4")
    assert text.endswith("Observation: you see a mug 1 and a cup 2 Action:")
    assert "room 3" not in text  # only the last `history` pairs


def test_budget_drops_oldest_history_first_then_cuts_the_observation() -> None:
    tok = WordTok()
    full = len(ChatPrompt(tok, history=6, max_prompt_tokens=1000).build(CTX))
    trimmed = ChatPrompt(tok, history=6, max_prompt_tokens=full - 5).build(CTX)
    assert len(trimmed) <= full - 5
    assert "go to 0".split()[-1] not in [tok.words[i] for i in trimmed[:12]]
    tight = ChatPrompt(tok, history=6, max_prompt_tokens=12).build(CTX)
    words = [tok.words[i] for i in tight]
    assert len(tight) <= 12 and "Action:" in words and "room" not in words


def test_admissible_commands_shown_only_when_asked() -> None:
    tok = WordTok()
    shown = [tok.words[i] for i in ChatPrompt(tok, show_admissible=True, history=0).build(CTX)]
    hidden = [tok.words[i] for i in ChatPrompt(tok, history=0).build(CTX)]
    assert "Admissible" in shown and "Admissible" not in hidden


def test_completion_ends_with_eos_and_stops_are_eos_only_without_a_newline_token() -> None:
    tok = WordTok()
    prompt = ChatPrompt(tok)
    assert prompt.completion("take mug 1")[-1] == tok.eos_token_id
    assert prompt.stop_token_ids() == [tok.eos_token_id]


def test_chat_template_path_with_a_real_tokenizer(tmp_path) -> None:  # noqa: ANN001
    pytest.importorskip("tokenizers", reason="the made tokenizer needs tokenizers/transformers (vllm environment)")
    pytest.importorskip("transformers", reason="the made tokenizer needs transformers (vllm environment)")
    from stages.envs import ENVS
    from stages.policy.vllm._make_model import build_tokenizer

    tok = build_tokenizer(list(ENVS.get("household")(max_steps=30).vocabulary()))
    prompt = ChatPrompt(tok, history=2)
    ctx = AgentContext("put a clean mug in cabinet 1", "You see a mug 1.", ("take mug 1",), (("You arrive.", "look"),))
    tokens = tok.convert_ids_to_tokens(prompt.build(ctx))
    assert tokens[:3] == ["<bos>", "<task>", "put"] and tokens[-1] == "<act>" and "<unk>" not in tokens
    assert tokens.count("<obs>") == 2 and tokens.count("<act>") == 2
    assert prompt.stop_token_ids() == [tok.eos_token_id, tok.convert_tokens_to_ids("\n")]
    assert tok.decode(prompt.completion("take mug 1"), skip_special_tokens=True) == "take mug 1"
    # The fast path (render, then the Rust backend) gives exactly the ids apply_chat_template gives.
    messages = [{"role": "system", "content": ctx.task}, {"role": "user", "content": "You arrive."},
                {"role": "assistant", "content": "look"}, {"role": "user", "content": ctx.observation}]
    expected = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert prompt.build(ctx) == list(expected)


def test_an_instruction_comes_first_and_only_when_set() -> None:
    tok = WordTok()
    told = [tok.words[i] for i in ChatPrompt(tok, history=0, instruction="Reply with one command.").build(CTX)]
    plain = [tok.words[i] for i in ChatPrompt(tok, history=0).build(CTX)]
    assert " ".join(told).startswith("Reply with one command. Task: find the mug")
    assert " ".join(plain).startswith("Task: find the mug") and "Reply" not in plain
