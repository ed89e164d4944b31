"""Behaviour cloning on expert demonstrations, and a fast synchronous lockstep evaluator.

`collect_demos` replays the suite's expert plan on each task and records, per step, the prompt built
exactly as `act()` builds it and the expert's action as the target. `train_bc` minimises the completion
tokens' negative log-likelihood, computed with the same `completion_logprobs` the learner uses.

`rollout_lockstep` plays many episodes in lockstep with one batched `generate` per step, without Trio;
it is what BC uses to report held-out success (greedy) and the group composition at G samples per task.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
import torch

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


def collect_demos(suite: EnvSuite, tasks: Sequence[Task], fmt: PromptFormat) -> tuple[list[Demo], int]:
    """One `Demo` per expert step over `tasks`; also returns how many expert plans did not win."""
    demos: list[Demo] = []
    failed = 0
    env = suite.make()
    try:
        for task in tasks:
            obs = env.reset(task)
            history: list[tuple[str, str]] = []
            won = False
            for action in suite.expert(task):
                ctx = AgentContext(task.description, obs.text, obs.admissible, tuple(history))
                demos.append(Demo(fmt.build(ctx), fmt.completion(action)))
                step = env.step(action)
                history.append((obs.text, action))
                obs, won = step.observation, step.won
                if step.done:
                    break
            failed += not won
    finally:
        env.close()
    return demos, failed


def _batches(demos: Sequence[Demo], batch_size: int, gen: torch.Generator) -> list[list[Demo]]:
    """Shuffled batches of similar prompt length (sorted within windows of 16 batches) to cut padding."""
    order = torch.randperm(len(demos), generator=gen).tolist()
    window = 16 * batch_size
    batches: list[list[Demo]] = []
    for w in range(0, len(order), window):
        chunk = sorted((demos[i] for i in order[w : w + window]), key=lambda d: len(d.prompt))
        batches += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
    perm = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[i] for i in perm]


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay from 1 to 0.1 at `total`."""
    cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * min(step, total) / total))
    return min(1.0, (step + 1) / warmup) * cosine


def train_bc(
    model: TinyLM,
    demos: Sequence[Demo],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    max_updates: int = 0,
) -> list[float]:
    """AdamW with a short warm-up and cosine decay; returns the mean loss of each epoch.

    `max_updates` > 0 stops early after that many optimizer steps (a deliberate under-training knob).
    """
    gen = torch.Generator().manual_seed(seed)
    steps_per_epoch = math.ceil(len(demos) / batch_size)
    total = epochs * steps_per_epoch if max_updates <= 0 else min(max_updates, epochs * steps_per_epoch)
    warmup = max(1, min(20, total // 10))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup, total))
    model.train()
    losses: list[float] = []
    step = 0
    started = time.perf_counter()
    for epoch in range(epochs):
        epoch_loss, seen = 0.0, 0
        for batch in _batches(demos, batch_size, gen):
            logp, mask = model.completion_logprobs([d.prompt for d in batch], [d.completion for d in batch])
            loss = -(logp * mask).sum() / mask.sum()  # mean NLL per completion token
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            epoch_loss += float(loss.detach()) * len(batch)
            seen += len(batch)
            step += 1
            if step >= total:
                break
        losses.append(epoch_loss / max(1, seen))
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
