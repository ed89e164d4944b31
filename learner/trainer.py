"""The synchronous GRPO update, run off the Trio thread by `learner.stage.LearnerStage`.

One update = one optimizer step on a batch of B training groups: group-relative advantages per
trajectory, every policy turn of every surviving trajectory becomes a training item (prompt, completion,
sampled log-probs, advantage), a fixed number of items is sampled (the reference's step items), and the
registered loss is averaged over micro-batches with gradient accumulation.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.config import LearnerSection
from pipeline.messages import GroupResult, TrajectoryStatus
from stages.policy.base import TrainableModel

from .advantages import group_advantages

LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True, slots=True)
class TrainItem:
    prompt_ids: list[int]
    token_ids: list[int]
    old_logprobs: list[float]
    advantage: float


def build_items(groups: Sequence[GroupResult], eps: float) -> list[TrainItem]:
    """Training items of every turn of every usable trajectory.

    Failed trajectories (env or policy error) are left out of their group's baseline; a group with fewer
    than two usable trajectories or zero advantage everywhere contributes nothing.
    """
    items: list[TrainItem] = []
    for group in groups:
        if group.cut:
            raise ValueError(f"group {group.group_id} was cut by a gate and must never reach the learner")
        usable = [t for t in group.trajectories if t.status == TrajectoryStatus.COMPLETE]
        if len(usable) < 2:
            continue
        advantages = group_advantages(torch.tensor([t.reward for t in usable], dtype=torch.float32), eps)  # [G]
        for trajectory, advantage in zip(usable, advantages.tolist(), strict=True):
            if advantage == 0.0:
                continue
            items += [
                TrainItem(turn.prompt_ids, turn.token_ids, turn.logprobs, advantage)
                for turn in trajectory.turns
                if turn.token_ids
            ]
    return items


def _padded(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)  # [N, T]
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


class Trainer:
    """Owns the trainable model and its optimizer; call `update` from one thread at a time."""

    def __init__(self, model: TrainableModel, cfg: LearnerSection, loss_fn: LossFn, *, seed: int = 0) -> None:
        self.model = model
        self.cfg = cfg
        self.loss_fn = loss_fn
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self._rng = random.Random(seed)

    def update(self, groups: Sequence[GroupResult]) -> tuple[dict[str, Any], dict[str, float]]:
        """One optimizer step on `groups`. Returns (a detached copy of the new weights, stats)."""
        torch.set_num_threads(self.cfg.torch_threads)
        items = build_items(groups, self.cfg.adv_eps)
        if self.cfg.max_items and len(items) > self.cfg.max_items:
            items = self._rng.sample(items, self.cfg.max_items)
        stats: dict[str, float] = {"learner/items": float(len(items)), "learner/groups": float(len(groups))}
        if items:
            stats |= self._step(items)
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return state, stats

    def _step(self, items: list[TrainItem]) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        chunks = [items[i : i + self.cfg.micro_batch] for i in range(0, len(items), self.cfg.micro_batch)]
        for chunk in chunks:
            new_logprobs, mask = self.model.completion_logprobs(
                [it.prompt_ids for it in chunk], [it.token_ids for it in chunk]
            )  # [n, T], [n, T]
            old = _padded([it.old_logprobs for it in chunk], new_logprobs.shape[1])  # [n, T]
            advantages = torch.tensor([it.advantage for it in chunk], dtype=torch.float32)  # [n]
            loss, stats = self.loss_fn(new_logprobs, old, advantages, mask, clip_eps=self.cfg.clip_eps)
            (loss * len(chunk) / len(items)).backward()
            for key, value in (stats | {"learner/loss": float(loss.detach())}).items():
                totals[key] = totals.get(key, 0.0) + value * len(chunk) / len(items)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        totals["learner/grad_norm"] = float(grad_norm)
        return totals

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer state and the item-sampling rng, copied (for checkpoints; call between updates)."""
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "rng": self._rng.getstate(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])  # type: ignore[attr-defined]
        self.optimizer.load_state_dict(state["optimizer"])
        self._rng.setstate(state["rng"])
