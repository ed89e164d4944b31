"""The learner's side of the hf backend: the served model, scoring the turns' command choices.

Every turn of this backend is an admissible command chosen whole (`_server.py`), recorded with the
commands it was chosen among (`Turn.choices`) and its command-nucleus size (`Turn.nucleus`). The learner
rescores the same distribution with `_scoring.py`'s functions, the ones sampling used, row by row: so the
learner/behaviour ratio is 1 at unchanged weights whatever the micro-batch holds (up to float rounding).
Model loading, LoRA (peft) and the adapter state are the vLLM backend's `CausalLMTrainable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from stages.policy.base import CompletionScores
from stages.policy.vllm._learner import CausalLMTrainable
from stages.policy.vllm._lora import load_adapter_state

from ._scoring import choice_logprobs, choice_scores


class ChoiceTrainable(CausalLMTrainable):
    """A `TrainableModel` whose `completion_logprobs` scores command choices (`choices=`)."""

    def completion_logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        choices: Sequence[Sequence[Sequence[int]]] | None = None,
        nucleus: Sequence[Sequence[int]] | None = None,
    ) -> CompletionScores:
        """Log-probs [N, T] of each completion (a command among its `choices`) under the command policy,
        its mask and entropies; `nucleus` (per completion, the command-nucleus size repeated per token)
        as recorded at sampling. Without `choices`: the token-level scores of `CausalLMTrainable`."""
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
        if choices is None:
            return super().completion_logprobs(prompts, completions, temperature=temperature, top_p=top_p)
        if not len(prompts) == len(completions) == len(choices):
            raise ValueError(f"{len(prompts)} prompts, {len(completions)} completions, {len(choices)} choices")
        chosen = []
        for i, (completion, options) in enumerate(zip(completions, choices, strict=True)):
            listed = [list(o) for o in options]
            if list(completion) not in listed:
                raise ValueError(f"completion {i} is not one of its choices: the hf backend only chooses among them")
            chosen.append(listed.index(list(completion)))
        scores = choice_scores(self.lm, prompts, choices)  # [N, K]
        sizes = None if nucleus is None else torch.tensor([k[0] if k else 0 for k in nucleus], device=scores.device)  # [N]
        logp, entropy = choice_logprobs(
            scores, choices, torch.tensor(chosen, device=scores.device), temperature=temperature, top_p=top_p, nucleus=sizes
        )  # [N, W] each
        T = max(1, max(len(c) for c in completions))
        mask = (torch.arange(T)[None, :] < torch.tensor([len(c) for c in completions])[:, None]).to(logp)  # [N, T]
        logp, entropy = logp[:, :T], entropy[:, :T]
        return CompletionScores(logp * mask, mask, entropy * mask)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Weights from `state_dict()` (a resumed run's checkpoint): the adapter's with LoRA, else the model's."""
        if self.lora is not None:
            load_adapter_state(self.lm, state)
        else:
            self.lm.load_state_dict(dict(state))
