"""Greedy success of a `transformers` causal LM on a suite's tasks, played in lockstep (no engine, no Trio).

`make-model` uses it to report what its behaviour cloning bought: held-out success of the saved model,
decoded greedily with the same prompt and action parsing as `VllmPolicy.act` (the engine's greedy decode
of the same float32 weights picks the same tokens up to float ties). One batched `generate` per step over
the episodes still running (left-padded; Llama derives positions from the attention mask).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.progress import report
from stages.envs.base import EnvSuite, Task
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
    envs = [suite.make() for _ in tasks]
    started = time.perf_counter()
    lm.eval()
    try:
        obs = [env.reset(task) for env, task in zip(envs, tasks, strict=True)]
        history: list[list[tuple[str, str]]] = [[] for _ in tasks]
        won = [False] * len(tasks)
        live = list(range(len(tasks)))
        for step in range(suite.max_steps):
            if not live:
                break
            contexts = [AgentContext(tasks[i].description, obs[i].text, obs[i].admissible, tuple(history[i])) for i in live]
            prompts = [prompt.build(c) for c in contexts]
            texts: list[str] = []
            for b in range(0, len(prompts), batch):
                texts += greedy_actions(lm, prompt, prompts[b : b + batch], max_new_tokens=max_new_tokens)
            still = []
            for i, text in zip(live, texts, strict=True):
                action = parse_action(text, obs[i].admissible, fuzzy_cutoff=fuzzy_cutoff)
                result = envs[i].step(action)
                history[i].append((obs[i].text, action))
                obs[i], won[i] = result.observation, result.won
                if not result.done:
                    still.append(i)
            live = still
            if label:
                report(label, len(tasks) - len(live), len(tasks), f"step {step + 1} | {sum(won)} won")
    finally:
        for env in envs:
            env.close()
    if label:
        report(label, len(tasks), len(tasks), f"{sum(won)} won | {time.perf_counter() - started:.0f} s", final=True)
    return [Played(task, won[i], len(history[i])) for i, task in enumerate(tasks)]
