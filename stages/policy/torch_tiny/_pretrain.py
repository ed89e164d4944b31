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
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch
import torch.nn.functional as F

from pipeline.progress import report
from stages.envs.base import Environment, EnvSuite, RecoveringExpert, Task
from stages.lockstep import play_lockstep
from stages.policy.base import AgentContext

from ._generate import Sample, generate
from ._model import TinyLM
from ._prompt import PromptFormat, parse_action
from ._server import SamplingConfig, request_uniforms

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Demo:
    prompt: list[int]
    completion: list[int]
    """The expert action's ids followed by `<eos>`."""
    target: bool = True
    """False for a noise-injected step: its action is context for later steps, never a target."""


def collect_demos(
    suite: EnvSuite, tasks: Sequence[Task], fmt: PromptFormat, *, noise: float = 0.0, seed: int = 0
) -> tuple[list[list[Demo]], int]:
    """The expert's steps on each task (one list per episode) and how many episodes were not won.

    With `noise` > 0 (DART-style), a step executes a random other admissible command with probability
    `noise`, and every step is labelled with the suite's recovering expert's action from the state
    reached (`RecoveringExpert.expert_action`), so the demonstrations also show how to recover from a
    detour. The noisy step itself is kept as context only (`Demo.target = False`): its successors
    still extend its prompt, so prefix packing stays intact.
    """
    recovering = _recovering(suite, "pretrain.noise") if noise > 0 else None
    rng = random.Random(f"rollcut:demo-noise:{seed}")
    episodes: list[list[Demo]] = []
    failed = 0
    env = suite.make()
    try:
        for task in tasks:
            obs = env.reset(task)
            plan = iter(suite.expert(task))
            history: list[tuple[str, str]] = []
            steps: list[Demo] = []
            won = False
            for _ in range(suite.max_steps):
                action = recovering.expert_action(env) if recovering is not None else next(plan, None)
                if action is None:
                    break
                ctx = AgentContext(task.description, obs.text, obs.admissible, tuple(history))
                if recovering is not None and rng.random() < noise:
                    action = rng.choice([c for c in obs.admissible if c != action] or [action])
                    steps.append(Demo(fmt.build(ctx), fmt.completion(action), target=False))
                else:
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


def _recovering(suite: EnvSuite, option: str) -> RecoveringExpert:
    if not isinstance(suite, RecoveringExpert):
        raise ValueError(f"{option} needs a suite whose expert acts from any state; {suite.name!r} has none")
    return suite


@dataclass(slots=True)
class Packed:
    """Consecutive steps of one episode in one sequence: `ids[target_pos[k]]` predicts `target_ids[k]`."""

    ids: list[int]
    target_pos: list[int]
    target_ids: list[int]
    steps: int


def pack_episode(demos: Sequence[Demo]) -> list[Packed]:
    """Pack each run of steps whose prompt extends the previous prompt + action into one sequence
    (a sequence with no target left, e.g. one noisy step alone, is dropped)."""
    packs: list[Packed] = []
    for demo in demos:
        prev = packs[-1] if packs else None
        if prev is None or demo.prompt[: len(prev.ids)] != prev.ids:
            prev = Packed([], [], [], 0)
            packs.append(prev)
        if demo.target:
            first = len(demo.prompt) - 1  # the prompt's last position predicts the first completion token
            prev.target_pos += range(first, first + len(demo.completion))
            prev.target_ids += demo.completion
            prev.steps += 1
        prev.ids = [*demo.prompt, *demo.completion[:-1]]  # inputs stop before the final <eos> target
    return [p for p in packs if p.steps]


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


def warmup_cosine_factor(step: int, warmup: int, total: int) -> float:
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
    label: str = "warm start",
    nll: Callable[[Any, Sequence[Packed]], tuple[torch.Tensor, int]] = packed_nll,
) -> list[float]:
    """AdamW with a short warm-up and cosine decay; returns the mean per-token loss of each epoch.

    `batch_size` counts demo steps (actions) per update. `max_updates` > 0 stops early after that many
    optimizer steps (a deliberate under-training knob). Progress goes to `pipeline.progress.report`
    under `label`: batches in place on a terminal, one line per epoch. `nll(model, batch)` scores a batch
    (the vLLM backend passes one for a Hugging Face model).
    """
    gen = torch.Generator().manual_seed(seed)
    per_epoch = len(_batches(packs, batch_size, torch.Generator().manual_seed(seed)))
    total = epochs * per_epoch if max_updates <= 0 else min(max_updates, epochs * per_epoch)
    warmup = max(1, min(20, total // 10))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine_factor(s, warmup, total))
    model.train()
    losses: list[float] = []
    step = 0
    started = time.perf_counter()
    for epoch in range(epochs):
        epoch_nll, epoch_tokens = 0.0, 0
        batches = _batches(packs, batch_size, gen)
        for b, batch in enumerate(batches):
            batch_nll, count = _bc_step(model, batch, nll, opt, sched)
            epoch_nll += batch_nll
            epoch_tokens += count
            step += 1
            report(
                f"{label}: epoch {epoch + 1}/{epochs}, batch", b + 1, len(batches),
                f"loss {epoch_nll / epoch_tokens:.3f} | {time.perf_counter() - started:.0f} s",
            )
            if step >= total:
                break
        losses.append(epoch_nll / max(1, epoch_tokens))
        report(
            f"{label}: epoch", epoch + 1, epochs,
            f"loss {losses[-1]:.4f} | {step} updates | {time.perf_counter() - started:.0f} s", final=True,
        )
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


def _bc_step(
    model: TinyLM,
    batch: Sequence[Packed],
    nll: Callable[[Any, Sequence[Packed]], tuple[torch.Tensor, int]],
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[float, int]:
    """One optimizer step on the batch's mean per-token NLL; returns (summed NLL, tokens)."""
    batch_nll, count = nll(model, batch)
    opt.zero_grad(set_to_none=True)
    (batch_nll / count).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return float(batch_nll.detach()), count


@dataclass(frozen=True, slots=True)
class LabelledEpisode:
    """An episode `rollout_lockstep` played (a `stages.lockstep.LockstepEpisode`) with, when an expert was
    given, the expert's action from every state it visited: what DAgger trains on and the BC report counts
    (not the rollout stage's `stages.episode.Episode`)."""

    task: Task
    won: bool
    steps: int
    actions: tuple[str, ...]
    labelled: tuple[Demo, ...] = ()
    """With an expert: every state of the episode with the expert's action from it (DAgger's data)."""


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
    expert: RecoveringExpert | None = None,
    label: str = "",
) -> list[LabelledEpisode]:
    """Play `samples` episodes per task, all in lockstep; episodes are ordered task-major.

    With `expert`, every state visited is also labelled with the expert's action (`LabelledEpisode.labelled`).
    A `label` reports progress (steps in place on a terminal, a line at the end) under that name.
    """
    runs = [task for task in tasks for _ in range(samples)]
    labelled: list[list[Demo]] = [[] for _ in runs]
    tok = fmt.tokenizer

    def decide(step: int, live: list[int], contexts: list[AgentContext], envs: list[Environment]) -> list[str]:
        prompts = [fmt.build(c) for c in contexts]
        uniforms = torch.stack(
            [request_uniforms(seed, i * suite.max_steps + step, sampling.max_new_tokens) for i in live]
        )  # [B, N]
        samples_out = _decode(model, fmt, sampling, prompts, uniforms, greedy, [c.admissible for c in contexts])
        if expert is not None:
            for i, prompt in zip(live, prompts, strict=True):
                labelled[i].append(Demo(prompt, fmt.completion(expert.expert_action(envs[i]))))
        return [
            parse_action(tok.decode(sample.token_ids), c.admissible, fuzzy_cutoff=sampling.fuzzy_cutoff)
            for c, sample in zip(contexts, samples_out, strict=True)
        ]

    played = play_lockstep(suite, runs, decide, label=label)
    return [LabelledEpisode(e.task, e.won, e.steps, e.actions, tuple(labelled[i])) for i, e in enumerate(played)]


def _decode(
    model: TinyLM,
    fmt: PromptFormat,
    sampling: SamplingConfig,
    prompts: Sequence[list[int]],
    uniforms: torch.Tensor,  # [B, N]
    greedy: bool,
    admissible: Sequence[Sequence[str]],
) -> list[Sample]:
    """One action per prompt, decoded in batches of `sampling.max_batch` as the policy server would."""
    out: list[Sample] = []
    for b in range(0, len(prompts), sampling.max_batch):
        rows = slice(b, b + sampling.max_batch)
        out += generate(
            model,
            prompts[rows],
            uniforms=uniforms[rows],
            greedy=[greedy] * len(prompts[rows]),
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop_ids=(fmt.tokenizer.eos_id, fmt.tokenizer.nl_id),
            choices=[sampling.choices(fmt, a) for a in admissible[rows]] if sampling.choose_admissible else None,
        )
    return out


@dataclass(frozen=True, slots=True)
class GroupComposition:
    all_fail: int
    mixed: int
    all_succeed: int

    @classmethod
    def of(cls, episodes: Sequence[LabelledEpisode], group_size: int) -> GroupComposition:
        counts = [0, 0, 0]
        for g in range(0, len(episodes), group_size):
            wins = sum(e.won for e in episodes[g : g + group_size])
            counts[0 if wins == 0 else 2 if wins == group_size else 1] += 1
        return cls(*counts)
