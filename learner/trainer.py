"""The synchronous GRPO update, run off the Trio thread by `learner.stage.LearnerStage`.

One update trains on a batch of B training groups:

1. group-relative advantages per trajectory (float64); every policy turn of every usable trajectory
   becomes a training item (prompt, completion, behaviour log-probs, advantage, policy version;
   `learner/items.py`);
2. items whose policy version lags the learner by more than `max_staleness` are dropped and counted
   (the staleness bound holds for every trained turn, whatever the pacing did);
3. optionally a fixed number of items is sampled (`max_items`, the reference's step items); the items
   beyond it are counted (`learner/items_beyond_max`);
4. `epochs` passes over the items in shuffled mini-batches of `minibatch_items` (0 = the whole batch in
   one step), each one optimizer step; the registered loss gives per-token terms and the registered
   aggregation their weights, computed once over all the update's items (so a trajectory whose turns
   spread over several steps weighs what it weighs in one) and scaled by the number of mini-batches
   per epoch (a step's weights sum to 1 on average, as one whole-batch step's do), accumulated exactly
   across micro-batches. The shuffle
   keeps turns that share a prompt (rollouts of a group that acted alike so far) next to each other, so
   they share a micro-batch and a model that encodes a repeated prompt once (`torch_tiny`) does so.
   With `skip_confident` > 0 the turns whose action had at least that probability under the behaviour
   policy are left out of the passes (their gradient scales with 1 - p), the others keeping the weights
   the whole update gave them;
5. with `max_kl` > 0 the update ends early once the approximate KL to the behaviour policy exceeds it:
   measured over an epoch (`kl_stop = "epoch"`, the next epoch is not run) or over each mini-batch before
   its optimizer step (`kl_stop = "step"`, that step is not taken: the target-KL stop of PPO
   implementations, which also acts when an update runs one epoch of several mini-batches);
6. the optimizer's lr for the update is `lr` x the schedule's factor at version / `run.updates`
   (`learner/schedules.py`; constant by default);
7. the weights returned for publishing are the new iterate, or with `ema` > 0 an exponential moving
   average of the iterates (`average_into`), which then is what rollouts sample from.

Per-update figures (metrics.jsonl): lr, items, tokens, ratio mean, clip fraction, approx KL to behaviour,
entropy of the sampling distribution, fraction of actions that were not admissible commands, staleness
lag max / mean, items dropped as stale, items beyond `max_items`, the share of items skipped as confident, epochs and optimizer steps run,
whether the KL stop cut the update short, train success of the batch, and the share of items
whose prompt is distinct (`learner/distinct_prompt_fraction`: what a repeated-prompt saving can save).
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from pipeline.config import LearnerSection
from pipeline.contracts import TrainableModel
from pipeline.devices import resolve_device
from pipeline.messages import GroupResult, TrajectoryStatus

from .items import TrainItem, build_items, prompt_key, shuffled_order
from .schedules import lr_factor

LossFn = Callable[..., torch.Tensor]
AggregationFn = Callable[..., torch.Tensor]


def _padded(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)  # [N, T]
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


class _Sums:
    """Token-weighted sums of per-token figures over an epoch."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.steps = 0
        self.items = self.skipped = 0
        self.ratio = self.clipped = self.kl = self.entropy = self.loss = 0.0

    def add(self, log_ratio: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, clip_eps: float) -> None:
        with torch.no_grad():
            ratio = log_ratio.exp()  # [n, T]
            self.tokens += float(mask.sum())
            self.ratio += float((ratio * mask).sum())
            self.clipped += float((((ratio - 1).abs() > clip_eps).float() * mask).sum())
            self.kl += float(((ratio - 1 - log_ratio) * mask).sum())  # k3 estimator of KL(mu || pi)
            self.entropy += float((entropy * mask).sum())

    def mean(self, value: float) -> float:
        return value / self.tokens if self.tokens else 0.0


class UpdateStopped(Exception):
    """`Trainer.stop()` was called: the update ended between two micro-batches, its weights not published."""


class Trainer:
    """Owns the trainable model and its optimizer; call `update` from one thread at a time."""

    def __init__(
        self,
        model: TrainableModel,
        cfg: LearnerSection,
        loss_fn: LossFn,
        *,
        aggregation: AggregationFn | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        total_updates: int = 1,
    ) -> None:
        from .aggregation import AGGREGATIONS

        self.model = model
        self.device = place(model, cfg.device)
        """Where the learner computes (`learner.device`); what it publishes and checkpoints is on the CPU."""
        self.cfg = cfg
        self.loss_fn = loss_fn
        self.aggregation = aggregation or AGGREGATIONS.get(cfg.aggregation)
        self.temperature = temperature
        self.top_p = top_p
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.total_updates = total_updates
        """The schedule's horizon (`run.updates`): update `version` runs at lr x lr_factor(version / total)."""
        self.reference = copy.deepcopy(model).requires_grad_(False) if cfg.kl_coef > 0 else None
        self._rng = random.Random(seed)
        self._average = self._weights() if cfg.ema > 0 else None
        """The published weights when `cfg.ema` > 0: a moving average of the iterates, from the initial weights."""
        self._bf16 = cfg.bf16 and self.device.type == "cuda"
        self._stopping = threading.Event()

    def update(self, groups: Sequence[GroupResult], *, version: int = 0) -> tuple[dict[str, Any], dict[str, float]]:
        """Train on `groups` with the weights of learner `version`. Returns (a detached copy of the new
        weights, stats)."""
        torch.set_num_threads(self.cfg.torch_threads)
        items, counts = build_items(
            groups, self.cfg.adv_eps, learner_version=version, max_staleness=self.cfg.max_staleness,
            keep_zero_advantage=self.cfg.keep_zero_advantage_items, negative_weight=self.cfg.negative_weight,
            step_weight=self.cfg.step_weight, gamma=self.cfg.gamma,
        )
        beyond_max = max(0, len(items) - self.cfg.max_items) if self.cfg.max_items else 0
        if beyond_max:
            items = self._rng.sample(items, self.cfg.max_items)
        rollouts = [t for g in groups for t in g.trajectories if t.status == TrajectoryStatus.COMPLETE]
        stats: dict[str, float] = {
            "learner/items": float(len(items)),
            "learner/groups": float(len(groups)),
            "learner/items_dropped_stale": float(counts.dropped_stale),
            "learner/tokens_dropped_stale": float(counts.stale_tokens),
            "learner/items_dropped_stale_zero_variance": float(counts.stale_zero_variance),
            "learner/tokens_dropped_stale_zero_variance": float(counts.stale_tokens_zero_variance),
            "learner/items_beyond_max": float(beyond_max),
            "learner/invalid_action_fraction": counts.invalid_actions / counts.turns if counts.turns else 0.0,
            "learner/step_signal_fraction": counts.step_signal / counts.turns if counts.turns else 0.0,
            "learner/batch_success": sum(t.success for t in rollouts) / len(rollouts) if rollouts else 0.0,
            "staleness_lag_max": float(max((it.lag for it in items), default=0)),
            "staleness_lag_mean": sum(it.lag for it in items) / len(items) if items else 0.0,
            "learner/distinct_prompt_fraction": len({prompt_key(it) for it in items}) / len(items) if items else 0.0,
        }
        lr = self.cfg.lr * lr_factor(self.cfg.lr_schedule, version, self.total_updates, self.cfg.lr_floor)
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr
        stats["learner/lr"] = lr
        if items:
            stats |= self._train(items)
        if self._average is not None:
            average_into(self._average, self.model.state_dict(), self.cfg.ema)
        return self.published(), stats

    def _weights(self) -> dict[str, Any]:
        return _copied(self.model.state_dict())

    def stop(self) -> None:
        """Stop the update in progress at its next micro-batch, and any later one at its first (`UpdateStopped`).
        From any thread: the learner stage calls it when its phase ends during an update, which on a real LM runs
        for minutes. Once stopped, the weights may be part-way through an update: only the state captured at the last
        update boundary (what the checkpoint and checkpoints/policy.pt hold) is the run's."""
        self._stopping.set()

    def published(self) -> dict[str, Any]:
        """A CPU copy of the weights the policy serves: the latest iterate, or its moving average (`ema`)."""
        return _copied(self.model.state_dict() if self._average is None else self._average, "cpu")

    def _forward(self) -> Any:
        """bf16 autocast around the learner's forward passes when `learner.bf16` is set on CUDA."""
        return torch.autocast("cuda", dtype=torch.bfloat16) if self._bf16 else contextlib.nullcontext()

    def _train(self, items: list[TrainItem]) -> dict[str, float]:
        self.model.train()
        size = self.cfg.minibatch_items or len(items)
        out: dict[str, float] = {}
        grad_norms: list[float] = []
        epochs = 0
        stopped = False
        step_limit = self.cfg.max_kl if self.cfg.kl_stop == "step" else 0.0
        weights = (self._item_weights(items) * math.ceil(len(items) / size)).to(self.device)  # [N] once per update
        for _ in range(self.cfg.epochs):
            order = shuffled_order(items, self._rng)
            sums = _Sums()
            for start in range(0, len(order), size):
                chosen = order[start : start + size]
                batch_kl = self._backward([items[i] for i in chosen], weights[chosen], sums)
                if step_limit and batch_kl > step_limit:
                    stopped = True  # this mini-batch's step and the rest of the update are not taken
                    break
                grad_norms.append(self._optimizer_step())
            epochs += 1
            kl = sums.mean(sums.kl)
            out = {
                "learner/loss": sums.loss / max(sums.steps, 1),
                "learner/ratio_mean": sums.mean(sums.ratio),
                "learner/clip_fraction": sums.mean(sums.clipped),
                "learner/approx_kl": kl,
                "learner/entropy": sums.mean(sums.entropy),
                "learner/tokens": sums.tokens,
                "learner/skipped_confident": sums.skipped / max(sums.items + sums.skipped, 1),
            }
            if stopped:
                break
            if self.cfg.max_kl and kl > self.cfg.max_kl and epochs < self.cfg.epochs:
                stopped = True  # the epochs left are not run
                break
        out["learner/epochs"] = float(epochs)
        out["learner/kl_stopped"] = float(stopped)
        out["learner/optimizer_steps"] = float(len(grad_norms))
        out["learner/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else 0.0
        return out

    def _item_weights(self, items: list[TrainItem]) -> torch.Tensor:
        """The registered aggregation's weight of each item [N], over all of the update's items."""
        lengths = torch.tensor([len(it.token_ids) for it in items], dtype=torch.float64)  # [N]
        trajectories = torch.tensor([it.trajectory for it in items])  # [N]
        return self.aggregation(lengths, trajectories, constant=self.cfg.norm_tokens).float()  # [N]

    def _backward(self, batch: list[TrainItem], weights: torch.Tensor, sums: _Sums) -> float:
        """The gradient of `batch`'s loss with the items' `weights` [n], accumulated over micro-batches, its
        figures added to `sums`; returns the mini-batch's approx KL to the behaviour policy."""
        self.optimizer.zero_grad(set_to_none=True)
        kl_before, tokens_before = sums.kl, sums.tokens
        if self.cfg.skip_confident:  # weights stay those the whole update gave; only the passes shrink
            kept = [i for i, it in enumerate(batch) if sum(it.old_logprobs) < math.log(self.cfg.skip_confident)]
            sums.skipped += len(batch) - len(kept)
            batch, weights = [batch[i] for i in kept], weights[kept]  # [k]
        sums.items += len(batch)
        step_loss = 0.0
        for lo in range(0, len(batch), self.cfg.micro_batch):
            if self._stopping.is_set():
                raise UpdateStopped(f"stopped after {lo} of {len(batch)} items of a mini-batch")
            chunk = batch[lo : lo + self.cfg.micro_batch]
            with self._forward():
                scores = self.model.completion_logprobs(
                    [it.prompt_ids for it in chunk], [it.token_ids for it in chunk],
                    temperature=self.temperature, top_p=self.top_p, **_recorded(chunk),
                )  # [c, T] each
            old = _padded([it.old_logprobs for it in chunk], scores.logprobs.shape[1]).to(self.device)  # [c, T]
            advantages = torch.tensor([it.advantage for it in chunk], dtype=torch.float32, device=self.device)  # [c]
            terms = self.loss_fn(scores.logprobs, old, advantages, scores.mask, clip_eps=self.cfg.clip_eps)  # [c, T]
            if self.reference is not None:
                terms = terms + self.cfg.kl_coef * self._reference_kl(chunk, scores.logprobs, scores.mask)
            loss = (terms.sum(dim=1) * weights[lo : lo + len(chunk)]).sum()  # []
            loss.backward()
            step_loss += float(loss.detach())
            sums.add((scores.logprobs - old) * scores.mask, scores.entropy, scores.mask, self.cfg.clip_eps)
        sums.loss += step_loss
        sums.steps += 1
        tokens = sums.tokens - tokens_before
        return (sums.kl - kl_before) / tokens if tokens else 0.0

    def _optimizer_step(self) -> float:
        """Clip the accumulated gradient, step; returns its norm before clipping."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        return float(grad_norm)

    def _reference_kl(self, chunk: list[TrainItem], logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-token k3 estimate of KL(pi || pi_ref) [c, T] (GRPO's KL penalty against the warm start)."""
        assert self.reference is not None
        with torch.no_grad(), self._forward():
            ref = self.reference.completion_logprobs(
                [it.prompt_ids for it in chunk], [it.token_ids for it in chunk],
                temperature=self.temperature, top_p=self.top_p, **_recorded(chunk),
            ).logprobs  # [c, T]
        log_ratio = ref - logprobs  # [c, T]
        return (log_ratio.exp() - log_ratio - 1) * mask

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer state, the item-sampling rng, the moving average (`ema`) and the KL reference
        (`kl_coef`), copied (for checkpoints; call between updates)."""
        return {
            "model": _copied(self.model.state_dict(), "cpu"),
            "optimizer": _on_cpu(self.optimizer.state_dict()),
            "rng": self._rng.getstate(),
            "average": None if self._average is None else _copied(self._average, "cpu"),
            "reference": None if self.reference is None else _copied(self.reference.state_dict(), "cpu"),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])  # type: ignore[attr-defined]
        if self.reference is not None and state.get("reference") is not None:
            # the KL penalty's anchor stays the warm start: the model it was copied from holds a checkpoint now
            self.reference.load_state_dict(state["reference"])  # type: ignore[attr-defined]
        self.optimizer.load_state_dict(state["optimizer"])
        self._rng.setstate(state["rng"])
        if self._average is not None:  # a checkpoint from before `ema` was set starts its average here
            saved = state.get("average")
            self._average = _copied(saved, self.device) if saved is not None else self._weights()


def published_weights(state: Mapping[str, Any]) -> dict[str, Any]:
    """The policy's weights in a `Trainer.state_dict()`: the moving average when `ema` kept one, else the
    learner's weights."""
    return state["average"] if state.get("average") is not None else state["model"]


def average_into(average: dict[str, torch.Tensor], weights: Mapping[str, torch.Tensor], decay: float) -> None:
    """average <- decay x average + (1 - decay) x weights, in place, for floating-point tensors; other
    tensors (integer buffers) take the new value."""
    with torch.no_grad():
        for name, value in weights.items():
            if value.is_floating_point():
                average[name].mul_(decay).add_(value.detach(), alpha=1 - decay)
            else:
                average[name].copy_(value)


def _copied(weights: Mapping[str, torch.Tensor], device: Any = None) -> dict[str, torch.Tensor]:
    """Detached copies, on `device` (None: where each tensor is)."""
    if device is None:
        return {k: v.detach().clone() for k, v in weights.items()}
    return {k: v.detach().to(device, copy=True) for k, v in weights.items()}


def _on_cpu(state: Any) -> Any:
    """A copy of a nested state (the optimizer's) with every tensor on the CPU, as `copy.deepcopy` copies it."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _on_cpu(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_on_cpu(v) for v in state)
    return copy.deepcopy(state)


def place(model: TrainableModel, spec: str) -> torch.device:
    """Move the trainable model to the device `learner.device` names and return that device. A backend's
    model that is not a torch Module (vllm's wrapper) stays where the backend put it, and its device is used."""
    device = resolve_device(spec)
    if isinstance(model, torch.nn.Module):
        model.to(device)
        return device
    return next(iter(model.parameters())).device


def _recorded(chunk: list[TrainItem]) -> dict[str, Any]:
    """What sampling recorded that scoring needs, for `completion_logprobs`: `choices=` when some turn's
    decoding was constrained, `nucleus=` when some turn recorded its nucleus sizes; nothing otherwise (so a
    model that cannot constrain decoding, or whose sampler reports no nucleus, is never asked to)."""
    out: dict[str, Any] = {}
    if any(it.choices for it in chunk):
        out["choices"] = [it.choices for it in chunk]
    if any(it.nucleus for it in chunk):
        out["nucleus"] = [it.nucleus for it in chunk]
    return out
