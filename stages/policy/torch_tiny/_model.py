"""A small decoder-only transformer (pre-norm GPT, tied embeddings) with a preallocated KV cache.

One forward serves three callers: batched prefill + cached decoding (`_generate.py`), and the learner's
`completion_logprobs`. Rows of a batch may be left-padded: `key_mask` marks real tokens, and `positions`
count real tokens only, so a padded row computes what it would compute alone (up to float rounding).

Log-prob convention: `completion_logprobs(..., temperature, top_p)` is the log-prob of each token under
the distribution rollouts sample from (`stages.policy.sampling`), the same quantity `generate` records, so
the importance ratio `exp(new - old)` is exactly 1 (up to float rounding) while the weights are unchanged.
Given the nucleus sizes sampling recorded (`nucleus=`, `Turn.nucleus`) it scores under them, so the
ratio stays 1 whatever else shares the batch (`stages.policy.sampling`).
Behaviour cloning scores at temperature 1 over the whole vocabulary (the defaults).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from stages.policy.base import CompletionScores
from stages.policy.choices import completion_mask, mask_logits
from stages.policy.sampling import sampled_logprobs, sampling_entropy

from ._commands import chosen_factors, command_scores


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    pad_id: int
    layers: int = 4
    d_model: int = 128
    heads: int = 4
    max_len: int = 256
    """Longest prompt + completion; prompts are built to fit (see `_prompt.py`)."""

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class KVCache:
    """Keys and values of every layer for a batch, preallocated to `size` positions."""

    k: torch.Tensor  # [L, B, H, S, Dh]
    v: torch.Tensor  # [L, B, H, S, Dh]

    @classmethod
    def empty(cls, cfg: ModelConfig, batch: int, size: int, device: torch.device | None = None) -> KVCache:
        shape = (cfg.layers, batch, cfg.heads, size, cfg.d_model // cfg.heads)
        return cls(torch.zeros(shape, device=device), torch.zeros(shape, device=device))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(
        self,
        x: torch.Tensor,  # [B, T, D]
        allowed: torch.Tensor | None,  # [B, 1, T, S] bool, None = plain causal (S == T)
        cache: tuple[torch.Tensor, torch.Tensor] | None,  # ([B, H, S_max, Dh], [B, H, S_max, Dh])
        start: int,
    ) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)  # 3 x [B, T, D]
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))  # [B,H,T,Dh]
        if cache is not None:
            cache[0][:, :, start : start + T] = k
            cache[1][:, :, start : start + T] = v
            k, v = cache[0][:, :, : start + T], cache[1][:, :, : start + T]  # [B, H, S, Dh]
        if allowed is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, Dh]
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # [B, H, T, Dh]
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Decoder-only LM; also the learner's `TrainableModel` (see `completion_logprobs`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.heads:
            raise ValueError(f"d_model ({cfg.d_model}) must be a multiple of heads ({cfg.heads})")
        self.cfg = cfg
        self.choose_by = "token"
        """How decoding constrained to `choices` picks a command: "token" (a trie over tokens,
        `stages.policy.choices`) or "command" (whole commands scored, `_commands.py`)."""
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: scale residual projections by depth
            nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * cfg.layers))  # type: ignore[union-attr, arg-type]

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def hidden(
        self,
        ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T]
        key_mask: torch.Tensor | None = None,  # [B, start + T] bool, True on real tokens
        cache: KVCache | None = None,
        start: int = 0,
        *,
        allowed: torch.Tensor | None = None,  # [B, 1, T, T] bool: an explicit attention mask (no cache)
    ) -> torch.Tensor:
        """Final-layer states [B, T, D] of `ids` placed at cache columns start..start+T-1.

        `allowed` replaces the causal mask (the packed rows of `_commands.py`)."""
        T = ids.shape[1]
        if allowed is None and (key_mask is not None or start > 0):
            allowed = attention_mask(key_mask, T, start, ids.device)  # [B, 1, T, start + T]
        x = self.tok_emb(ids) + self.pos_emb(positions)  # [B, T, D]
        for layer, block in enumerate(self.blocks):
            kv = None if cache is None else (cache.k[layer], cache.v[layer])
            x = block(x, allowed, kv, start)
        return self.ln_f(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[..., D] -> [..., V] (the output head is the token embedding, transposed)."""
        return h @ self.tok_emb.weight.T

    def forward(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V] of unpadded (or right-padded) `ids` [B, T] without a cache."""
        if positions is None:
            positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        return self.logits(self.hidden(ids, positions))

    def completion_logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        choices: Sequence[Sequence[Sequence[int]]] | None = None,
        nucleus: Sequence[Sequence[int]] | None = None,
    ) -> CompletionScores:
        """Log-probs [N, T] of each completion token under the (temperature, top-p) sampling distribution,
        their mask [N, T] and the distribution's entropy [N, T].

        Sequences are right-padded, so each row's positions are 0..len-1 as in generation, and the head
        is applied only at the positions that predict a completion token. With `choices` (per completion,
        the token sequences its decoding was constrained to; `stages.policy.choices`), the distribution is
        the constrained one the tokens were sampled from. With `nucleus` (per completion, each token's
        nucleus size recorded at sampling, `Sample.nucleus`; [] = the top-p rule) each token is scored
        under that many most likely tokens.
        """
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if nucleus is not None and any(k and len(k) != len(c) for k, c in zip(nucleus, completions, strict=True)):
            raise ValueError("a recorded nucleus must have one size per completion token (or none)")
        if choices is not None and self.choose_by == "command":
            return self._command_logprobs(prompts, completions, choices, temperature=temperature, top_p=top_p, nucleus=nucleus)
        seqs = [[*p, *c] for p, c in zip(prompts, completions, strict=True)]
        if any(len(s) > self.cfg.max_len for s in seqs):
            raise ValueError(f"a prompt + completion is longer than max_len={self.cfg.max_len}")
        N, L = len(seqs), max(len(s) for s in seqs)
        T = max(1, max(len(c) for c in completions))
        device = self.tok_emb.weight.device
        ids = torch.full((N, L), self.cfg.pad_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        start = torch.tensor([len(p) for p in prompts])  # [N] first completion index
        lengths = torch.tensor([len(c) for c in completions])  # [N]
        t = torch.arange(T)  # [T]
        mask = t[None, :] < lengths[:, None]  # [N, T]
        targets_at = (start[:, None] + t[None, :]).clamp(max=L - 1)  # [N, T]
        predict_at = (targets_at - 1).clamp(min=0)  # [N, T] the position whose output scores the target
        ids, targets_at, predict_at = ids.to(device), targets_at.to(device), predict_at.to(device)
        h = self.hidden(ids, torch.arange(L, device=device).expand(N, L))  # [N, L, D]
        h = h.gather(1, predict_at[..., None].expand(-1, -1, h.shape[-1]))  # [N, T, D]
        logits = self.logits(h)  # [N, T, V]
        if choices is not None:  # the constrained decoding's mask (stages.policy.choices)
            allowed = completion_mask(choices, completions, T, logits.shape[-1]).to(device)  # [N, T, V]
            logits = mask_logits(logits, allowed)
        targets = ids.gather(1, targets_at)  # [N, T]
        sizes = None if nucleus is None else _padded_sizes(nucleus, T).to(device)  # [N, T]
        token_logp = sampled_logprobs(logits, targets, temperature=temperature, top_p=top_p, nucleus=sizes)  # [N, T]
        entropy = sampling_entropy(logits, temperature=temperature, top_p=top_p, nucleus=sizes)  # [N, T]
        mask = mask.to(device=device, dtype=token_logp.dtype)
        return CompletionScores(token_logp * mask, mask, entropy * mask)

    def _command_logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        choices: Sequence[Sequence[Sequence[int]]],
        *,
        temperature: float,
        top_p: float,
        nucleus: Sequence[Sequence[int]] | None,
    ) -> CompletionScores:
        """`completion_logprobs` under the command policy (`_commands.py`) for the rows whose completion is
        one of their choices; the others (decoded free) are scored token by token. A command's recorded
        nucleus is its command nucleus, the same size for each of its tokens."""
        T = max(1, max(len(c) for c in completions))
        by_command = [i for i, (c, options) in enumerate(zip(completions, choices, strict=True)) if list(c) in options]
        rest = sorted(set(range(len(completions))) - set(by_command))
        device = self.tok_emb.weight.device
        logp = torch.zeros(len(completions), T, device=device)
        entropy = torch.zeros(len(completions), T, device=device)
        mask = (torch.arange(T)[None, :] < torch.tensor([len(c) for c in completions])[:, None]).float().to(device)
        if by_command:
            options = [choices[i] for i in by_command]
            scores = command_scores(self, [prompts[i] for i in by_command], options)  # [n, K]
            chosen = torch.tensor([o.index(list(completions[i])) for i, o in zip(by_command, options, strict=True)])
            sizes = None if nucleus is None else torch.tensor([nucleus[i][0] if nucleus[i] else 0 for i in by_command])  # [n]
            lp, ent = chosen_factors(scores, options, chosen.to(device), T, temperature=temperature, top_p=top_p,
                                     vocab=self.cfg.vocab_size, nucleus=None if sizes is None else sizes.to(device))  # [n, T] each
            logp = logp.index_put((torch.tensor(by_command, device=device),), lp)
            entropy = entropy.index_put((torch.tensor(by_command, device=device),), ent)
        if rest:
            free = self.completion_logprobs(
                [prompts[i] for i in rest], [completions[i] for i in rest], temperature=temperature, top_p=top_p,
                nucleus=None if nucleus is None else [nucleus[i] for i in rest],
            )  # decoded free: no choices, so scored token by token
            index = (torch.tensor(rest, device=device),)
            width = (0, T - free.logprobs.shape[1])
            logp = logp.index_put(index, F.pad(free.logprobs, width))
            entropy = entropy.index_put(index, F.pad(free.entropy, width))
        return CompletionScores(logp * mask, mask, entropy * mask)


def _padded_sizes(nucleus: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """Recorded nucleus sizes [N, width], 0 (the top-p rule) where none was recorded."""
    out = torch.zeros(len(nucleus), width, dtype=torch.long)
    for i, sizes in enumerate(nucleus):
        out[i, : len(sizes)] = torch.tensor(list(sizes), dtype=torch.long)
    return out


def attention_mask(key_mask: torch.Tensor | None, T: int, start: int, device: torch.device) -> torch.Tensor:
    """Which keys each of T queries (at columns start..start+T-1) may attend: [B or 1, 1, T, start + T].

    Causal, never a padding key, but always itself, so a padding query's softmax is never empty.
    """
    S = start + T
    q_col = torch.arange(start, S, device=device)[:, None]  # [T, 1]
    k_col = torch.arange(S, device=device)[None, :]  # [1, S]
    causal = k_col <= q_col  # [T, S]
    if key_mask is None:
        return causal[None, None]  # [1, 1, T, S]
    allowed = causal[None] & key_mask[:, None, :S]  # [B, T, S]
    return (allowed | (k_col == q_col)[None])[:, None]  # [B, 1, T, S]
