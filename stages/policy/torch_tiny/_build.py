"""`torch_tiny_backend`: tokenizer + model + prompt format from the config, warm-started by cached BC.

The warm start is cached under `policy.cache_dir` as `torch_tiny-<suite>-<key>.pt`, where `key` hashes
everything that changes it: the cache format, suite name and step limit, the tokenizer's word list,
model / prompt / BC options, the pretrain section, the seed, and the demonstrations themselves (prompt and
target ids of every expert step), so a changed environment or expert never reuses a stale checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec
import structlog
import torch

from pipeline.devices import resolve_device
from pipeline.progress import report as report_progress
from pipeline.task_ranges import DEFAULT_SIZES, task_range
from stages.envs.base import EnvSuite, RecoveringExpert
from stages.policy.base import decode_backend_options

from ._model import ModelConfig, TinyLM
from ._pretrain import (
    Demo,
    GroupComposition,
    Packed,
    collect_demos,
    pack_episode,
    rollout_lockstep,
    train_bc,
)
from ._prompt import PromptFormat
from ._server import SamplingConfig, TorchTinyPolicy
from ._tokenizer import WordTokenizer

if TYPE_CHECKING:
    from pipeline.config import PolicySection, PretrainSection

log = structlog.get_logger(__name__)

CACHE_FORMAT = 2


class TinyOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`policy.options` of the torch_tiny backend."""

    layers: int = 4
    d_model: int = 128
    heads: int = 4
    max_len: int = 256
    history: int = 8
    """Most earlier (observation, action) pairs in the prompt (the oldest go first to fit the budget)."""
    show_admissible: bool = False
    """List the admissible commands in the prompt (longer prompts; parsing maps to them anyway)."""
    max_obs_tokens: int = 64
    max_prompt_tokens: int = 200
    memory: bool = False
    """Earlier turns' actions stay in the prompt after their observations leave the history window
    (`PromptFormat.memory`): what a searching agent needs to know where it has looked."""
    pin_first: bool = False
    """Keep the episode's first observation (the room's listing) in the prompt (`PromptFormat.pin_first`)."""
    pin_tokens: int = 0
    """Words kept from the pinned observation (0 = `max_obs_tokens`; `PromptFormat.pin_tokens`)."""
    fuzzy_cutoff: float = 75.0
    """rapidfuzz ratio (0-100) a generated command needs to be mapped to an admissible one."""
    choose_admissible: bool = False
    """Decode only admissible commands (`stages.policy.choices`): every action is valid, and the learner
    scores the same constrained distribution. Off: free generation mapped to a command by `fuzzy_cutoff`."""
    choose_by: str = "token"
    """With `choose_admissible`, how a command is picked: "token" (each token among those continuing an
    admissible command) or "command" (each admissible command scored whole by the model, then one drawn
    from softmax(score / T); `_commands.py`): the object of a "take" counts before the verb is chosen."""
    threads: int = 1
    """torch threads in the decoding worker thread."""
    bc_threads: int = 2
    """torch threads while behaviour cloning (0 = leave torch's setting alone)."""
    bc_max_updates: int = 0
    """Stop BC after this many optimizer steps (0 = all epochs): the deliberate under-training knob."""
    bc_eval_tasks: int = 0
    """Held-out tasks per split for the greedy success reported after BC (0 = skip): the first of the dev range,
    at most its default 200 (a warm start's report never reads valid or test tasks)."""
    bc_group_tasks: int = 0
    """Train tasks sampled G=8 times (temperature 1) to report the group composition after BC (0 = skip)."""


def decode_tiny_options(options: dict[str, Any], max_new_tokens: int) -> TinyOptions:
    """`policy.options` decoded strictly into `TinyOptions` and checked against the rest of the section
    (`stages.policy.base.decode_backend_options`; raises ValueError listing every problem)."""
    return cast("TinyOptions", decode_backend_options(torch_tiny_backend, "torch_tiny", options, max_new_tokens, _section_problems))


def check(cfg: PolicySection) -> list[str]:
    """What `TinyOptions` alone cannot tell (`PolicyBackend.check`): its options against the rest of the
    section; nothing when they do not decode (`check_backend` lists those problems already)."""
    try:
        opts = msgspec.convert(cfg.options, TinyOptions)
    except msgspec.ValidationError:
        return []
    return _section_problems(opts, cfg.max_new_tokens)


def _section_problems(opts: TinyOptions, max_new_tokens: int) -> list[str]:
    problems = []
    if opts.max_prompt_tokens + max_new_tokens > opts.max_len:
        problems.append(
            f"policy.options: max_prompt_tokens ({opts.max_prompt_tokens}) + policy.max_new_tokens "
            f"({max_new_tokens}) must not exceed max_len ({opts.max_len})"
        )
    if opts.choose_by not in ("token", "command"):
        problems.append(f"policy.options.choose_by must be 'token' or 'command', not {opts.choose_by!r}")
    if not 0 <= opts.bc_eval_tasks <= DEFAULT_SIZES["dev"]:
        problems.append(f"policy.options.bc_eval_tasks must be in [0, {DEFAULT_SIZES['dev']}] (the dev range), not {opts.bc_eval_tasks}")
    if opts.choose_by == "command" and not opts.choose_admissible:
        problems.append("policy.options.choose_by = 'command' needs choose_admissible = true")
    return problems


def torch_tiny_backend(
    cfg: PolicySection, pretrain: PretrainSection, suite: EnvSuite, *, seed: int
) -> TorchTinyPolicy:
    """The torch_tiny policy for `suite`, behaviour-cloned (or loaded from the cache) when enabled: the
    registered `PolicyBackend` `stages.policy.POLICIES["torch_tiny"]`."""
    opts = decode_tiny_options(cfg.options, cfg.max_new_tokens)
    tokenizer = WordTokenizer.from_vocabulary(suite.vocabulary())
    fmt = PromptFormat(
        tokenizer,
        history=opts.history,
        show_admissible=opts.show_admissible,
        max_obs_tokens=opts.max_obs_tokens,
        max_prompt_tokens=opts.max_prompt_tokens,
        memory=opts.memory,
        pin_first=opts.pin_first,
        pin_tokens=opts.pin_tokens,
    )
    model_cfg = ModelConfig(
        vocab_size=len(tokenizer),
        pad_id=tokenizer.pad_id,
        layers=opts.layers,
        d_model=opts.d_model,
        heads=opts.heads,
        max_len=opts.max_len,
    )
    torch.manual_seed(seed)
    model = TinyLM(model_cfg).to(resolve_device(cfg.device))  # initialised on the CPU (the same weights anywhere)
    model.choose_by = opts.choose_by
    sampling = SamplingConfig(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=cfg.max_new_tokens,
        max_batch=cfg.max_batch,
        max_wait_ms=cfg.max_wait_ms,
        threads=opts.threads,
        fuzzy_cutoff=opts.fuzzy_cutoff,
        empty_output_action=cfg.empty_output_action,
        choose_admissible=opts.choose_admissible,
    )
    log.info("policy.model", params=model.num_parameters(), vocab=len(tokenizer), **model_cfg.to_dict())
    if pretrain.enabled:
        warm_start(model, fmt, suite, sampling, opts, pretrain, cache_dir=Path(cfg.cache_dir), seed=seed)
    return TorchTinyPolicy(model, fmt, sampling, seed=seed)


def warm_start(
    model: TinyLM,
    fmt: PromptFormat,
    suite: EnvSuite,
    sampling: SamplingConfig,
    opts: TinyOptions,
    pretrain: PretrainSection,
    *,
    cache_dir: Path,
    seed: int,
) -> dict[str, Any]:
    """Load the cached BC checkpoint for this configuration, or train, evaluate and cache it.

    Returns the BC report (losses, wall time, held-out success, group composition).
    """
    expert = _recovering_expert(suite, pretrain)
    noise = pretrain.noise if expert is not None else 0.0
    demo_tasks = list(suite.tasks("train"))[: pretrain.demos]
    episodes, failed = collect_demos(suite, demo_tasks, fmt, noise=noise, seed=seed)
    if failed and noise == 0:
        log.warning("policy.bc.expert_failed", tasks=failed, of=len(demo_tasks))
    demos = [d for episode in episodes for d in episode]
    key = cache_key(suite, fmt, model.cfg, opts, pretrain, seed, demos)
    path = cache_dir / f"torch_tiny-{suite.name}-{key[:16]}.pt"
    if path.exists():
        return _load_cached(model, path)
    packs = [p for episode in episodes for p in pack_episode(episode)]
    log.info(
        "policy.bc.start", steps=len(demos), tasks=len(demo_tasks), noisy_episodes_lost=failed if noise > 0 else 0,
        sequences=len(packs), tokens=sum(len(p.ids) for p in packs), epochs=pretrain.epochs, path=str(path),
    )
    previous_threads = torch.get_num_threads()
    if opts.bc_threads > 0:
        torch.set_num_threads(opts.bc_threads)
    try:
        started = time.perf_counter()
        losses = train_bc(
            model, packs, epochs=pretrain.epochs, lr=pretrain.lr, batch_size=pretrain.batch_size, seed=seed,
            max_updates=opts.bc_max_updates,
        )
        report: dict[str, Any] = {"losses": [round(x, 4) for x in losses]}
        if pretrain.dagger_rounds and expert is not None:
            report |= dagger(model, fmt, suite, expert, sampling, pretrain, packs, seed=seed)
        report["train_s"] = round(time.perf_counter() - started, 1)
        report |= bc_report(model, fmt, suite, sampling, opts, seed=seed)
    finally:
        torch.set_num_threads(previous_threads)
    _save(model, fmt, report, path)
    return report


def _recovering_expert(suite: EnvSuite, pretrain: PretrainSection) -> RecoveringExpert | None:
    """The suite as an expert that acts from any state (noise, DAgger), or None; refuses DAgger without one."""
    expert = suite if isinstance(suite, RecoveringExpert) else None
    if pretrain.dagger_rounds and expert is None:
        raise ValueError(
            f"pretrain.dagger_rounds needs a suite whose expert acts from any state; {suite.name!r} has none"
        )
    if pretrain.noise > 0 and expert is None:  # the default noise must not break suites without one
        log.warning("policy.bc.noise_ignored", suite=suite.name, reason="the suite's expert cannot act from any state")
    return expert


def _load_cached(model: TinyLM, path: Path) -> dict[str, Any]:
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(saved["state"])
    report = json.loads(saved["report"])
    log.info("policy.bc.cache_hit", path=str(path), **report)
    report_progress("warm start: cached", 1, 1, _summary(report), final=True)
    return report


def _save(model: TinyLM, fmt: PromptFormat, report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    state = {k: v.to("cpu") for k, v in model.state_dict().items()}  # the cache loads on any device
    torch.save({"state": state, "report": json.dumps(report), "tokenizer": fmt.tokenizer.to_json()}, tmp)
    os.replace(tmp, path)  # atomic: a concurrent run never reads half a file
    log.info("policy.bc.done", path=str(path), **report)
    report_progress("warm start: done", 1, 1, _summary(report), final=True)


def _summary(report: dict[str, Any]) -> str:
    figures = [f"trained in {report['train_s']:.0f} s"] if "train_s" in report else []
    figures += [f"{k.removeprefix('success_')} {v:.1%}" for k, v in report.items() if k.startswith("success_")]
    if "groups_mixed" in report:
        figures.append(
            f"groups fail / mixed / succeed {report['groups_all_fail']} / {report['groups_mixed']} / "
            f"{report['groups_all_succeed']}"
        )
    return ", ".join(figures)


def dagger(
    model: TinyLM,
    fmt: PromptFormat,
    suite: EnvSuite,
    expert: RecoveringExpert,
    sampling: SamplingConfig,
    pretrain: PretrainSection,
    packs: list[Packed],
    *,
    seed: int,
) -> dict[str, Any]:
    """`pretrain.dagger_rounds` rounds of DAgger after BC: play the policy at the rollout temperature on
    fresh train tasks, label every state with the recovering expert's action, train on everything.

    Extends `packs` in place; returns the per-round success of the played episodes and the losses.
    """
    train = list(suite.tasks("train"))
    rounds: dict[str, list[float]] = {"dagger_success": [], "dagger_losses": []}
    for r in range(pretrain.dagger_rounds):
        start = pretrain.demos + r * pretrain.dagger_tasks
        tasks = train[start : start + pretrain.dagger_tasks]
        name = f"warm start: DAgger round {r + 1}/{pretrain.dagger_rounds}"
        played = rollout_lockstep(
            model, fmt, suite, tasks, sampling, greedy=False, seed=seed + 1 + r, expert=expert, label=f"{name}, episodes"
        )
        packs += [p for e in played for p in pack_episode(e.labelled)]
        losses = train_bc(
            model, packs, epochs=pretrain.dagger_epochs, lr=pretrain.dagger_lr or pretrain.lr, batch_size=pretrain.batch_size,
            seed=seed + 1 + r, label=name,
        )
        rounds["dagger_success"].append(round(sum(e.won for e in played) / max(1, len(played)), 3))
        rounds["dagger_losses"].append(round(losses[-1], 4))
    return rounds


def bc_report(
    model: TinyLM,
    fmt: PromptFormat,
    suite: EnvSuite,
    sampling: SamplingConfig,
    opts: TinyOptions,
    *,
    seed: int,
) -> dict[str, Any]:
    """Greedy held-out success per split, and the G=8 group composition on train tasks if asked."""
    report: dict[str, Any] = {}
    started = time.perf_counter()
    if opts.bc_eval_tasks > 0:
        for split in ("heldout_seen", "heldout_unseen"):
            tasks = task_range(suite.tasks(split), "dev", DEFAULT_SIZES, opts.bc_eval_tasks)
            episodes = rollout_lockstep(
                model, fmt, suite, tasks, sampling, greedy=True, seed=seed, label=f"warm start: {split}, episodes"
            )
            report[f"success_{split}"] = round(sum(e.won for e in episodes) / max(1, len(episodes)), 3)
    if opts.bc_group_tasks > 0:
        tasks = list(suite.tasks("train"))[-opts.bc_group_tasks :]
        episodes = rollout_lockstep(
            model, fmt, suite, tasks, sampling, samples=8, greedy=False, seed=seed, label="warm start: groups of 8"
        )
        comp = GroupComposition.of(episodes, 8)
        report |= {
            "groups_all_fail": comp.all_fail,
            "groups_mixed": comp.mixed,
            "groups_all_succeed": comp.all_succeed,
        }
    report["eval_s"] = round(time.perf_counter() - started, 1)
    return report


_NOT_IN_KEY = ("threads", "bc_threads", "bc_eval_tasks", "bc_group_tasks")
"""Options that change speed or the report only, never the weights (thread counts change float rounding
at most), so a checkpoint is reused whatever they are."""
_DECODING = {"choose_admissible": False, "choose_by": "token"}
"""Decoding options (with their defaults): hashed only when DAgger runs and they differ from the default
(DAgger's states come from the policy's own decoding; behaviour cloning alone never decodes)."""
_KEYED_WHEN_SET = ("memory", "pin_first", "pin_tokens")
"""Options added after checkpoints were first cached: hashed only when set, so those checkpoints stay valid."""


def cache_key(
    suite: EnvSuite,
    fmt: PromptFormat,
    model_cfg: ModelConfig,
    opts: TinyOptions,
    pretrain: PretrainSection,
    seed: int,
    demos: list[Demo],
) -> str:
    """sha256 (hex) of everything that determines the warm-start weights and their report."""
    h = hashlib.sha256()
    header = {
        "format": CACHE_FORMAT,
        "suite": suite.name,
        "max_steps": suite.max_steps,
        "words": list(fmt.tokenizer.words),
        "model": model_cfg.to_dict(),
        "options": {
            k: v for k, v in msgspec.to_builtins(opts).items()
            if k not in _NOT_IN_KEY and (k not in _DECODING or (v != _DECODING[k] and pretrain.dagger_rounds))
            and (k not in _KEYED_WHEN_SET or v)
        },
        "pretrain": {k: v for k, v in msgspec.to_builtins(pretrain).items() if k != "enabled"},
        "seed": seed,
        "torch": torch.__version__,
    }
    recovery = getattr(suite, "recovery", None)  # a suite's choice of recovering expert, if it has one
    if pretrain.dagger_rounds and recovery not in (None, "omniscient"):
        header["recovery"] = recovery  # DAgger's labels come from it (the demos' labels are hashed below)
        if recovery == "mixed":
            header["searching_share"] = suite.searching_share  # type: ignore[attr-defined]  # household's (recovery = "mixed" is)
    h.update(json.dumps(header, sort_keys=True).encode())
    for demo in demos:
        h.update(json.dumps([demo.prompt, demo.completion]).encode())
    return h.hexdigest()


torch_tiny_backend.Options = TinyOptions  # type: ignore[attr-defined]  # `PolicyBackend.Options`
torch_tiny_backend.check = check  # type: ignore[attr-defined]  # `PolicyBackend.check`
