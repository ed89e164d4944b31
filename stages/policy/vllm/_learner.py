"""The learner's side of the vLLM backend: a `transformers` causal LM that scores completions.

Log-prob convention (the same as vLLM with `logprobs_mode="processed_logprobs"` and as torch_tiny):
the log-prob of a token under the distribution it was *sampled* from, i.e. logits / temperature, then
top-p: sorting ascending, tokens whose cumulative probability (themselves included) is <= 1 - top_p are
removed (the most likely token always stays), and the rest renormalised. So at unchanged weights the
importance ratio exp(new - old) is 1 up to float rounding (tested against the engine).

A sampled token that falls outside the new nucleus after an update would get -inf; it is floored at
`LOGPROB_FLOOR` (ratio ~0, no gradient through it), which keeps every loss finite.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

LOGPROB_FLOOR = -30.0


def processed_logprobs(logits: torch.Tensor, *, temperature: float, top_p: float) -> torch.Tensor:
    """[..., V] logits -> [..., V] log-probs of the temperature-scaled, top-p renormalised distribution.

    temperature <= 0 (greedy) scores at temperature 1 without top-p, as vLLM does for greedy requests.
    """
    z = logits.float()
    if temperature <= 0:
        return z.log_softmax(dim=-1)
    z = z / temperature
    if top_p < 1.0:
        sorted_z, order = z.sort(dim=-1, descending=False)  # [..., V] ascending
        cum = sorted_z.softmax(dim=-1).cumsum(dim=-1)  # [..., V] mass of tokens <= this one
        drop_sorted = cum <= 1 - top_p  # [..., V]
        drop_sorted[..., -1] = False  # at least one token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # [..., V] back in vocab order
        z = z.masked_fill(drop, float("-inf"))
    return z.log_softmax(dim=-1)


class CausalLMTrainable:
    """A Hugging Face causal LM as the learner's `TrainableModel` (`stages.policy.base`).

    `state_dict()` keys are the checkpoint's own names (`model.layers.0.self_attn.q_proj.weight`, ...),
    which is what vLLM's `model.load_weights` takes, so the learner's weights go to the engine unrenamed.
    """

    def __init__(self, lm: Any, *, temperature: float, top_p: float) -> None:
        self.lm = lm
        self.temperature = temperature
        self.top_p = top_p

    @classmethod
    def load(cls, path: str, *, temperature: float, top_p: float, state: Mapping[str, Any] | None = None) -> CausalLMTrainable:
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if state is not None:
            lm.load_state_dict(dict(state), strict=False)
        return cls(lm.requires_grad_(True).train(), temperature=temperature, top_p=top_p)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.lm.parameters()

    def state_dict(self) -> dict[str, Any]:
        return self.lm.state_dict()

    def train(self, mode: bool = True) -> CausalLMTrainable:
        self.lm.train(mode)
        return self

    def completion_logprobs(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs [N, T], mask [N, T]) of each completion token under the sampling distribution."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        seqs = [[*p, *c] for p, c in zip(prompts, completions, strict=True)]
        N, L = len(seqs), max(len(s) for s in seqs)
        T = max(1, max(len(c) for c in completions))
        device = next(self.lm.parameters()).device
        ids = torch.zeros(N, L, dtype=torch.long)  # [N, L] right-padded
        attention = torch.zeros(N, L, dtype=torch.long)  # [N, L]
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            attention[i, : len(s)] = 1
        start = torch.tensor([len(p) for p in prompts])  # [N]
        lengths = torch.tensor([len(c) for c in completions])  # [N]
        t = torch.arange(T)  # [T]
        mask = t[None, :] < lengths[:, None]  # [N, T]
        targets_at = (start[:, None] + t[None, :]).clamp(max=L - 1)  # [N, T]
        predict_at = (targets_at - 1).clamp(min=0)  # [N, T]
        ids, attention = ids.to(device), attention.to(device)
        h = self.lm.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state  # [N, L, D]
        h = h.gather(1, predict_at.to(device)[..., None].expand(-1, -1, h.shape[-1]))  # [N, T, D]
        logp = processed_logprobs(self.lm.get_output_embeddings()(h), temperature=self.temperature, top_p=self.top_p)  # [N, T, V]
        targets = ids.gather(1, targets_at.to(device))  # [N, T]
        token_logp = logp.gather(-1, targets[..., None]).squeeze(-1).clamp(min=LOGPROB_FLOOR)  # [N, T]
        mask = mask.to(device)
        return torch.where(mask, token_logp, torch.zeros_like(token_logp)), mask.to(token_logp.dtype)
