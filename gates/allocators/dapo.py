"""DAPO dynamic sampling (allocators.md §1): train only on groups whose rewards differ.

The synchronous recipe (`dapo_sync_batch`, kept as the reference the tests pin down) generates rounds of
prompts, keeps a group iff its reward std > 0 (or it has a single rollout), stops once B groups are kept,
truncates the batch to B groups (B·n rollouts) and raises after `max_num_gen_batches` rounds.

Streaming mapping (§1e): each group is G rollouts of one fresh prompt; a finished group trains iff it passes
`dapo_keep`, else it is dropped. New prompts are admitted while the groups ready for the learner plus the
expected yield of those in flight (in-flight × running non-zero-variance rate) fall short of
`B · (1 + lookahead_batches)`: the surplus beyond one batch is not discarded as in the recipe but trains in
the next update (the runtime's staleness bound limits how stale). `max_num_gen_batches` becomes: finished
groups since the current batch started may not exceed `max_num_gen_batches · gen_batch_groups`.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any

import msgspec

from pipeline.messages import GroupResult

from ._common import YieldPacer, rewards_of, trainable
from .base import Admission, AllocatorBase, AllocatorContext


def dapo_keep(rewards: Sequence[float]) -> bool:
    """DAPO's filter: keep a group iff the std of its rewards is > 0, or it holds a single rollout."""
    return len(rewards) == 1 or (len(rewards) > 1 and statistics.pstdev(rewards) > 0)


class TooManyGenerationRounds(RuntimeError):
    """DAPO's "Generated too many" error: the rounds limit passed without filling a batch."""


def dapo_sync_batch(
    rounds: Iterable[Sequence[Sequence[float]]], train_groups: int, max_num_gen_batches: int
) -> tuple[list[Sequence[float]], int]:
    """The synchronous DAPO loop (verl `recipe/dapo/dapo_ray_trainer.py`) over rounds of group rewards.

    Args:
        rounds: each round is the reward lists of the groups one generation call produced.
        train_groups: B, groups per update.
        max_num_gen_batches: M; <= 0 means unlimited.

    Returns:
        (the batch: exactly B kept groups, i.e. B·n rollouts, surplus discarded; rounds consumed).

    Raises:
        TooManyGenerationRounds: M rounds did not yield B kept groups.
        ValueError: the rounds ran out first.
    """
    batch: list[Sequence[float]] = []
    used = 0
    for groups in rounds:
        used += 1
        batch += [g for g in groups if dapo_keep(g)]
        if len(batch) >= train_groups:
            return batch[:train_groups], used
        if 0 < max_num_gen_batches <= used:
            raise TooManyGenerationRounds(
                f"generated {used} rounds, kept {len(batch)} < {train_groups} groups"
            )
    raise ValueError(f"rounds ran out after {used} rounds with {len(batch)} < {train_groups} kept groups")


class DapoAllocator(AllocatorBase):
    name = "dapo"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        lookahead_batches: Annotated[float, msgspec.Meta(ge=0)] = 1.0
        """Batches beyond the current one the expected yield may cover (surplus trains next update)."""
        max_num_gen_batches: int = 10
        """DAPO's M: rounds of `gen_batch_groups` finished groups allowed per batch; <= 0 = unlimited."""
        gen_batch_groups: Annotated[int, msgspec.Meta(ge=0)] = 0
        """Groups per generation round; 0 = 3·B (the recipe's gen_prompt_bsz = 3 · train_prompt_bsz)."""

    def __init__(self, options: Options, ctx: AllocatorContext) -> None:
        super().__init__(options, ctx)
        self._opts = options
        self._pacer = YieldPacer(ctx.batch_groups, options.lookahead_batches)
        self._round_groups = options.gen_batch_groups or 3 * ctx.batch_groups
        self._since_batch = 0
        """Finished groups since the current batch started filling."""

    def next_admission(self, free_slots: int) -> Admission | None:
        if not self._pacer.admit(len(self.in_flight)):
            return None
        if not self.fits(self.ctx.group_size, free_slots):
            return None
        return Admission(task_id=self.next_task(), size=self.ctx.group_size)

    def decide(self, result: GroupResult, admission: Admission) -> list[GroupResult]:
        self._since_batch += 1
        keep = trainable(result) and dapo_keep(rewards_of(result))
        self._pacer.observe(keep)
        if not keep:
            self.drop()
            self._check_rounds()
            return []
        self._pacer.emitted()
        if self.ledger.counts["groups_trained"] % self.ctx.batch_groups == self.ctx.batch_groups - 1:
            self._since_batch = 0  # this group completes a batch
        return [self.train(result)]

    def _check_rounds(self) -> None:
        limit = self._opts.max_num_gen_batches * self._round_groups
        if self._opts.max_num_gen_batches > 0 and self._since_batch >= limit:
            filled = self.ledger.counts["groups_trained"] % self.ctx.batch_groups
            raise TooManyGenerationRounds(
                f"dapo allocator: {self._since_batch} groups finished without filling a batch "
                f"({filled}/{self.ctx.batch_groups} kept; limit max_num_gen_batches={self._opts.max_num_gen_batches}"
                f" x {self._round_groups} groups): nearly every prompt is zero-variance; "
                f"raise allocator.options.max_num_gen_batches or set it to 0 (unlimited)"
            )

    def on_update(self, version: int) -> None:
        self._pacer.updated()

    def extra_statistics(self) -> Mapping[str, float]:
        return {"allocator/expected_yield": self._pacer.yield_rate}

    def extra_state(self) -> dict[str, Any]:
        return {"pacer": self._pacer.state_dict(), "since_batch": self._since_batch}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._pacer.load_state_dict(state["pacer"])
        self._since_batch = int(state["since_batch"])
