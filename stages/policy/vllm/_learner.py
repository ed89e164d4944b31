"""The learner's side of the vLLM backend: a `transformers` causal LM that scores completions.

Log-prob convention (the same as vLLM with `logprobs_mode="processed_logprobs"` and as torch_tiny):
the log-prob of a token under the distribution it was *sampled* from, i.e. logits / temperature, then
top-p: sorting ascending, tokens whose cumulative probability (themselves included) is <= 1 - top_p are
removed (the most likely token always stays), and the rest renormalised. So at unchanged weights the
importance ratio exp(new - old) is 1 up to float rounding (tested against the engine).

`processed_logprobs` writes vLLM's rule out over the whole vocabulary (tests check it keeps the same
nucleus as the shared `stages.policy.sampling` rule); the learner scores with the shared functions, which
widen the nucleus to a scored token that left it after an update, so every loss stays finite.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Self

import torch

from stages.policy.base import CompletionScores
from stages.policy.sampling import sampled_logprobs, sampling_entropy

from ._lora import LoraSettings, adapter_state, apply_lora, load_adapter_state


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

    Full fine-tune: `state_dict()` keys are the checkpoint's own names (`model.layers.0.self_attn.q_proj.
    weight`, ...), which is what vLLM's `load_weights` takes, so the learner's weights go to the engine
    unrenamed. With `lora`, the model is wrapped by peft, `parameters()` are the adapter's only and
    `state_dict()` is the adapter state (`_lora.py`), which the policy sends as a vLLM LoRA adapter.
    Scores use the shared sampling definition (`stages.policy.sampling`), the one vLLM's
    `processed_logprobs` mode records.
    """

    def __init__(self, lm: Any, *, temperature: float, top_p: float, lora: LoraSettings | None = None) -> None:
        self.lm = lm
        self.temperature = temperature
        self.top_p = top_p
        self.lora = lora

    @classmethod
    def load(
        cls,
        path: str,
        *,
        temperature: float,
        top_p: float,
        state: Mapping[str, Any] | None = None,
        lora: LoraSettings | None = None,
    ) -> Self:
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if lora is not None:
            lm = apply_lora(lm, lora)
            if state is not None:
                load_adapter_state(lm, state)
            return cls(lm.train(), temperature=temperature, top_p=top_p, lora=lora)
        if state is not None:
            lm.load_state_dict(dict(state), strict=False)
        return cls(lm.requires_grad_(True).train(), temperature=temperature, top_p=top_p)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.lm.parameters() if p.requires_grad)

    def state_dict(self) -> dict[str, Any]:
        return adapter_state(self.lm) if self.lora is not None else self.lm.state_dict()

    def train(self, mode: bool = True) -> CausalLMTrainable:
        self.lm.train(mode)
        return self

    def requires_grad_(self, flag: bool = True) -> CausalLMTrainable:
        """For the learner's frozen reference copy (`kl_coef` > 0)."""
        self.lm.requires_grad_(flag)
        return self

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
        """Log-probs [N, T] of each completion token under the sampling distribution, mask, entropy. `choices`
        and `nucleus` are the `TrainableModel` contract's: this backend never constrains decoding and its
        sampler reports no nucleus, so the learner passes neither (`learner.trainer`: only when some turn
        recorded one); one that is not empty is refused."""
        if any(choices or ()) or any(nucleus or ()):
            raise ValueError("the vLLM backend's learner scores no constrained choices and no recorded nucleus")
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        temperature = self.temperature if temperature is None else temperature
        top_p = self.top_p if top_p is None else top_p
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
        mask = (t[None, :] < lengths[:, None]).to(device)  # [N, T]
        targets_at = (start[:, None] + t[None, :]).clamp(max=L - 1).to(device)  # [N, T]
        predict_at = (targets_at - 1).clamp(min=0)  # [N, T]
        ids, attention = ids.to(device), attention.to(device)
        h = self.lm.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state  # [N, L, D]
        h = h.gather(1, predict_at[..., None].expand(-1, -1, h.shape[-1]))  # [N, T, D]
        logits = self.lm.get_output_embeddings()(h)  # [N, T, V]
        targets = ids.gather(1, targets_at)  # [N, T]
        token_logp = sampled_logprobs(logits, targets, temperature=temperature, top_p=top_p)  # [N, T]
        entropy = sampling_entropy(logits, temperature=temperature, top_p=top_p)  # [N, T]
        zero = torch.zeros_like(token_logp)
        return CompletionScores(
            torch.where(mask, token_logp, zero), mask.to(token_logp.dtype), torch.where(mask, entropy, zero)
        )
