"""Greedy success of a `transformers` causal LM on a suite's tasks, played in lockstep (no engine, no Trio).

`make-model` uses it to report what its behaviour cloning bought: held-out success of the saved model,
decoded greedily with the same prompt and action parsing as `VllmPolicy.act` (the engine's greedy decode
of the same float32 weights picks the same tokens up to float ties). One batched `generate` per step over
the episodes still running (left-padded; Llama derives positions from the attention mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from stages.envs.base import Environment, EnvSuite, Task
from stages.lockstep import play_lockstep
from stages.policy.base import AgentContext
from stages.policy.torch_tiny._prompt import parse_action

from ._prompt import ChatPrompt


@dataclass(frozen=True, slots=True)
class Played:
    task: Task
    won: bool
    steps: int


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, L] ids, [N, L] attention mask) with every prompt right-aligned."""
    N, L = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((N, L), pad_id, dtype=torch.long)  # [N, L]
    mask = torch.zeros(N, L, dtype=torch.long)  # [N, L]
    for i, p in enumerate(prompts):
        ids[i, L - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[i, L - len(p) :] = 1
    return ids, mask


@torch.no_grad()
def greedy_actions(lm: Any, prompt: ChatPrompt, prompts: Sequence[Sequence[int]], *, max_new_tokens: int) -> list[str]:
    """The decoded greedy completion of each prompt, stopped at the prompt format's stop tokens."""
    tok = prompt.tokenizer
    ids, mask = left_padded(prompts, tok.pad_token_id)
    out = lm.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=prompt.stop_token_ids(),
        pad_token_id=tok.pad_token_id,
    )  # [N, L + T]
    return [tok.decode(row[ids.shape[1] :], skip_special_tokens=True) for row in out]


def play_greedy(
    lm: Any,
    prompt: ChatPrompt,
    suite: EnvSuite,
    tasks: Sequence[Task],
    *,
    max_new_tokens: int,
    fuzzy_cutoff: float,
    batch: int = 64,
    label: str = "",
) -> list[Played]:
    """Play every task once, greedily, all episodes in lockstep."""
    lm.eval()

    def decide(step: int, live: list[int], contexts: list[AgentContext], envs: list[Environment]) -> list[str]:
        prompts = [prompt.build(c) for c in contexts]
        texts: list[str] = []
        for b in range(0, len(prompts), batch):
            texts += greedy_actions(lm, prompt, prompts[b : b + batch], max_new_tokens=max_new_tokens)
        return [parse_action(t, c.admissible, fuzzy_cutoff=fuzzy_cutoff) for c, t in zip(contexts, texts, strict=True)]

    return [Played(e.task, e.won, e.steps) for e in play_lockstep(suite, tasks, decide, label=label)]
