"""Behaviour cloning on expert demonstrations, and a fast synchronous lockstep evaluator.

`collect_demos` replays the suite's expert plan on each task and records, per step, the prompt built
exactly as `act()` builds it and the expert's action as the target.

Prefix packing: within an episode, step t+1's prompt usually *extends* step t's prompt plus its action
(the history window has not started sliding yet), so the steps are packed into one sequence with a
target at every action token (and `<eos>` after each action's last token). Because attention is causal
and every prompt starts at position 0, the packed loss equals the sum of the per-step completion losses
(`completion_logprobs`), in one forward pass over ~4x fewer tokens.

`rollout_lockstep` plays many episodes in lockstep with one batched `generate` per step, without Trio;
BC uses it to report held-out success (greedy) and the group composition at G samples per task.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch
import torch.nn.functional as F

from stages.envs.base import EnvSuite, Task
from stages.policy.base import AgentContext

from ._generate import generate
from ._model import TinyLM
from ._prompt import PromptFormat, parse_action
from ._server import SamplingConfig, request_uniforms

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Demo:
    prompt: list[int]
    completion: list[int]
    """The expert action's ids followed by `<eos>`."""


def collect_demos(suite: EnvSuite, tasks: Sequence[Task], fmt: PromptFormat) -> tuple[list[list[Demo]], int]:
    """The expert's steps on each task (one list per episode) and how many expert plans did not win."""
    episodes: list[list[Demo]] = []
    failed = 0
    env = suite.make()
    try:
        for task in tasks:
            obs = env.reset(task)
            history: list[tuple[str, str]] = []
            steps: list[Demo] = []
            won = False
            for action in suite.expert(task):
                ctx = AgentContext(task.description, obs.text, obs.admissible, tuple(history))
                steps.append(Demo(fmt.build(ctx), fmt.completion(action)))
                step = env.step(action)
                history.append((obs.text, action))
                obs, won = step.observation, step.won
                if step.done:
                    break
            episodes.append(steps)
            failed += not won
    finally:
        env.close()
    return episodes, failed


@dataclass(slots=True)
class Packed:
    """Consecutive steps of one episode in one sequence: `ids[target_pos[k]]` predicts `target_ids[k]`."""

    ids: list[int]
    target_pos: list[int]
    target_ids: list[int]
    steps: int


def pack_episode(demos: Sequence[Demo]) -> list[Packed]:
    """Pack each run of steps whose prompt extends the previous prompt + action into one sequence."""
    packs: list[Packed] = []
    for demo in demos:
        prev = packs[-1] if packs else None
        if prev is None or demo.prompt[: len(prev.ids)] != prev.ids:
            prev = Packed([], [], [], 0)
            packs.append(prev)
        first = len(demo.prompt) - 1  # the prompt's last position predicts the first completion token
        prev.target_pos += range(first, first + len(demo.completion))
        prev.target_ids += demo.completion
        prev.ids = [*demo.prompt, *demo.completion[:-1]]  # inputs stop before the final <eos> target
        prev.steps += 1
    return packs


def packed_nll(model: TinyLM, batch: Sequence[Packed]) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood of every target token of `batch`, and how many there are."""
    device = model.tok_emb.weight.device
    N, L = len(batch), max(len(p.ids) for p in batch)
    ids = torch.full((N, L), model.cfg.pad_id, dtype=torch.long)  # [N, L] right-padded
    for i, p in enumerate(batch):
        ids[i, : len(p.ids)] = torch.tensor(p.ids)
    rows = torch.tensor([i for i, p in enumerate(batch) for _ in p.target_pos])  # [K]
    cols = torch.tensor([c for p in batch for c in p.target_pos])  # [K]
    targets = torch.tensor([t for p in batch for t in p.target_ids], device=device)  # [K]
    ids = ids.to(device)
    h = model.hidden(ids, torch.arange(L, device=device).expand(N, L))  # [N, L, D]
    logits = model.logits(h[rows.to(device), cols.to(device)]).float()  # [K, V]
    return F.cross_entropy(logits, targets, reduction="sum"), len(targets)


def _batches(packs: Sequence[Packed], steps_per_batch: int, gen: torch.Generator) -> list[list[Packed]]:
    """Shuffled batches of about `steps_per_batch` demo steps; similar lengths share a batch."""
    order = torch.randperm(len(packs), generator=gen).tolist()
    window = 16 * steps_per_batch
    batches: list[list[Packed]] = []
    for w in range(0, len(order), window):
        batch: list[Packed] = []
        for pack in sorted((packs[i] for i in order[w : w + window]), key=lambda p: len(p.ids)):
            batch.append(pack)
            if sum(p.steps for p in batch) >= steps_per_batch:
                batches.append(batch)
                batch = []
        if batch:
            batches.append(batch)
    perm = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[i] for i in perm]


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay from 1 to 0.1 at `total`."""
    cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * min(step, total) / total))
    return min(1.0, (step + 1) / warmup) * cosine


def train_bc(
    model: TinyLM,
    packs: Sequence[Packed],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    max_updates: int = 0,
    nll: Callable[[Any, Sequence[Packed]], tuple[torch.Tensor, int]] = packed_nll,
) -> list[float]:
    """AdamW with a short warm-up and cosine decay; returns the mean per-token loss of each epoch.

    `batch_size` counts demo steps (actions) per update. `max_updates` > 0 stops early after that many
    optimizer steps (a deliberate under-training knob). `nll(model, batch)` scores a batch (the vLLM
    backend passes one for a Hugging Face model).
    """
    gen = torch.Generator().manual_seed(seed)
    per_epoch = len(_batches(packs, batch_size, torch.Generator().manual_seed(seed)))
    total = epochs * per_epoch if max_updates <= 0 else min(max_updates, epochs * per_epoch)
    warmup = max(1, min(20, total // 10))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, total))
    model.train()
    losses: list[float] = []
    step = 0
    started = time.perf_counter()
    for epoch in range(epochs):
        epoch_nll, epoch_tokens = 0.0, 0
        for batch in _batches(packs, batch_size, gen):
            batch_nll, count = nll(model, batch)
            opt.zero_grad(set_to_none=True)
            (batch_nll / count).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            epoch_nll += float(batch_nll.detach())
            epoch_tokens += count
            step += 1
            if step >= total:
                break
        losses.append(epoch_nll / max(1, epoch_tokens))
        log.info(
            "policy.bc.epoch",
            epoch=epoch + 1,
            updates=step,
            loss=round(losses[-1], 4),
            elapsed_s=round(time.perf_counter() - started, 1),
        )
        if step >= total:
            break
    model.eval()
    return losses


@dataclass(frozen=True, slots=True)
class Episode:
    task: Task
    won: bool
    steps: int
    actions: tuple[str, ...]


def rollout_lockstep(
    model: TinyLM,
    fmt: PromptFormat,
    suite: EnvSuite,
    tasks: Sequence[Task],
    sampling: SamplingConfig,
    *,
    samples: int = 1,
    greedy: bool = True,
    seed: int = 0,
) -> list[Episode]:
    """Play `samples` episodes per task, all in lockstep; episodes are ordered task-major."""
    runs = [(task, k) for task in tasks for k in range(samples)]
    envs = [suite.make() for _ in runs]
    try:
        obs = [env.reset(task) for env, (task, _) in zip(envs, runs, strict=True)]
        history: list[list[tuple[str, str]]] = [[] for _ in runs]
        won = [False] * len(runs)
        live = list(range(len(runs)))
        tok = fmt.tokenizer
        for step in range(suite.max_steps):
            if not live:
                break
            contexts = [
                AgentContext(runs[i][0].description, obs[i].text, obs[i].admissible, tuple(history[i]))
                for i in live
            ]
            prompts = [fmt.build(ctx) for ctx in contexts]
            uniforms = torch.stack(
                [request_uniforms(seed, i * suite.max_steps + step, sampling.max_new_tokens) for i in live]
            )  # [B, N]
            samples_out = []
            for b in range(0, len(live), sampling.max_batch):
                samples_out += generate(
                    model,
                    prompts[b : b + sampling.max_batch],
                    uniforms=uniforms[b : b + sampling.max_batch],
                    greedy=[greedy] * len(prompts[b : b + sampling.max_batch]),
                    max_new_tokens=sampling.max_new_tokens,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    stop_ids=(tok.eos_id, tok.nl_id),
                )
            still = []
            for i, sample in zip(live, samples_out, strict=True):
                text = tok.decode(sample.token_ids)
                action = parse_action(text, obs[i].admissible, fuzzy_cutoff=sampling.fuzzy_cutoff)
                result = envs[i].step(action)
                history[i].append((obs[i].text, action))
                obs[i], won[i] = result.observation, result.won
                if not result.done:
                    still.append(i)
            live = still
    finally:
        for env in envs:
            env.close()
    return [
        Episode(task, won[i], len(history[i]), tuple(a for _, a in history[i]))
        for i, (task, _) in enumerate(runs)
    ]


@dataclass(frozen=True, slots=True)
class GroupComposition:
    all_fail: int
    mixed: int
    all_succeed: int

    @classmethod
    def of(cls, episodes: Sequence[Episode], group_size: int) -> GroupComposition:
        counts = [0, 0, 0]
        for g in range(0, len(episodes), group_size):
            wins = sum(e.won for e in episodes[g : g + group_size])
            counts[0 if wins == 0 else 2 if wins == group_size else 1] += 1
        return cls(*counts)
