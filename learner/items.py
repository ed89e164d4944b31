"""Training items: one per policy turn of a batch's usable trajectories, with its advantage.

`build_items` turns a batch of finished groups into items (group-relative advantages in float64, plus
GiGPO's step-level term when asked) and counts what it left out; `shuffled_order` orders them for the
trainer's passes so that turns sharing a prompt sit in one micro-batch.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus
from pipeline.outcomes import is_zero_variance, label_rewards

from .advantages import discounted_returns, group_advantages, step_advantages


@dataclass(frozen=True, slots=True)
class TrainItem:
    prompt_ids: list[int]
    token_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    trajectory: int
    """Index of its trajectory within the batch (for per-trajectory aggregation)."""
    lag: int
    """Learner version minus the policy version that generated this turn."""
    admissible: bool = True
    choices: list[list[int]] = field(default_factory=list)
    """What the turn's decoding was constrained to (`Turn.choices`); [] = unconstrained."""
    nucleus: list[int] = field(default_factory=list)
    """Each token's nucleus size at sampling (`Turn.nucleus`); [] = not recorded."""


@dataclass(frozen=True, slots=True)
class ItemCounts:
    dropped_stale: int = 0
    zero_advantage: int = 0
    turns: int = 0
    invalid_actions: int = 0
    step_signal: int = 0
    """Turns whose step-level advantage is non-zero (a same-state comparison told their action apart)."""
    stale_tokens: int = 0
    """Tokens of the turns dropped as stale (`dropped_stale`)."""
    stale_zero_variance: int = 0
    stale_tokens_zero_variance: int = 0
    """Of the stale turns and their tokens, those of zero-variance groups (the ledger of work by fate splits them)."""


def build_items(
    groups: Sequence[GroupResult],
    eps: float,
    *,
    learner_version: int = 0,
    max_staleness: int | None = None,
    keep_zero_advantage: bool = False,
    negative_weight: float = 1.0,
    step_weight: float = 0.0,
    gamma: float = 0.95,
) -> tuple[list[TrainItem], ItemCounts]:
    """Training items of every turn of every usable trajectory, and what was left out.

    Failed trajectories (env or policy error) are left out of their group's baseline; a group with fewer
    than two usable trajectories contributes nothing; zero-advantage trajectories contribute nothing
    unless `keep_zero_advantage` (the reference's dilution); negative advantages are scaled by
    `negative_weight` (0 = positive-sample reinforcement: failures then contribute nothing); turns older than `max_staleness` versions
    are dropped and counted. With `step_weight` > 0 each turn's advantage adds `step_weight` times its
    GiGPO step-level advantage (returns discounted by `gamma`, compared among the group's turns from the
    same anchor state; `learner.advantages.step_advantages`).
    """
    items: list[TrainItem] = []
    stale = zero = turns = invalid = step_signal = stale_tokens = stale_zv = stale_tokens_zv = 0
    trajectory_index = 0
    for group in groups:
        if group.cut:
            raise ValueError(f"group {group.group_id} was cut by a gate and must never reach the learner")
        usable = [t for t in group.trajectories if t.status == TrajectoryStatus.COMPLETE]
        if len(usable) < 2:
            continue
        episode, steps = _turn_advantages(usable, eps, gamma if step_weight else None)
        zero_variance = is_zero_variance(label_rewards(group))
        for trajectory, trajectory_advantage, step_terms in zip(usable, episode, steps, strict=True):
            trajectory_index += 1
            for turn, step_term in zip(trajectory.turns, step_terms, strict=True):
                if not turn.token_ids:
                    continue
                advantage = trajectory_advantage + step_weight * step_term
                step_signal += step_term != 0.0
                if advantage < 0:
                    advantage *= negative_weight
                turns += 1
                invalid += not turn.admissible
                if advantage == 0.0 and not keep_zero_advantage:
                    zero += 1
                    continue
                lag = learner_version - turn.policy_version
                if max_staleness is not None and lag > max_staleness:
                    stale += 1
                    stale_tokens += len(turn.token_ids)
                    stale_zv += zero_variance
                    stale_tokens_zv += len(turn.token_ids) if zero_variance else 0
                    continue
                items.append(
                    TrainItem(
                        turn.prompt_ids, turn.token_ids, turn.logprobs, advantage, trajectory_index, lag,
                        turn.admissible, turn.choices, turn.nucleus,
                    )
                )
    counts = ItemCounts(dropped_stale=stale, zero_advantage=zero, turns=turns, invalid_actions=invalid, step_signal=step_signal,
                        stale_tokens=stale_tokens, stale_zero_variance=stale_zv, stale_tokens_zero_variance=stale_tokens_zv)
    return items, counts


def _turn_advantages(
    usable: Sequence[Trajectory], eps: float, gamma: float | None
) -> tuple[list[float], list[list[float]]]:
    """The group advantage of each trajectory, and per trajectory the step-level advantage of each turn
    (GiGPO, returns discounted by `gamma`; all zero when `gamma` is None: step level off)."""
    episode = group_advantages(torch.tensor([t.reward for t in usable], dtype=torch.float64), eps)  # [G]
    if gamma is None:
        return episode.tolist(), [[0.0] * len(t.turns) for t in usable]
    returns = [discounted_returns(torch.tensor([turn.reward for turn in t.turns], dtype=torch.float64), gamma) for t in usable]
    steps = step_advantages([[turn.anchor for turn in t.turns] for t in usable], returns, eps)  # per trajectory [T_i]
    return episode.tolist(), [s.tolist() for s in steps]


def prompt_key(item: TrainItem) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    return tuple(item.prompt_ids), tuple(map(tuple, item.choices))


def shuffled_order(items: Sequence[TrainItem], rng: random.Random) -> list[int]:
    """Indices of `items` in random order, except that items with the same prompt and choices stay together
    (in the order given): the distinct prompts are shuffled, each followed by all of its items."""
    together: dict[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], list[int]] = {}
    for i, item in enumerate(items):
        together.setdefault(prompt_key(item), []).append(i)
    keys = list(together)
    rng.shuffle(keys)
    return [i for key in keys for i in together[key]]


def shuffled_by_prompt(items: Sequence[TrainItem], rng: random.Random) -> list[TrainItem]:
    """`items` in `shuffled_order`."""
    return [items[i] for i in shuffled_order(items, rng)]
