"""The policy contract: batched, cancellation-safe `act()` plus versioned weight loading.

A backend (registered in `stages.policy.POLICIES`) builds a `Policy` for a suite; the runtime starts its
`serve()` loop in a nursery, trajectories call `act()` concurrently, and the learner gets a trainable copy
of the same model through `trainable()` and sends weights back with `load_weights()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import trio

from pipeline.contracts import (
    CompletionScores as CompletionScores,  # re-exported: contracts live in pipeline/
)
from pipeline.contracts import TrainableModel as TrainableModel


@dataclass(frozen=True, slots=True)
class AgentContext:
    task: str
    """The task description."""
    observation: str
    """The current observation text."""
    admissible: tuple[str, ...]
    history: tuple[tuple[str, str], ...] = ()
    """Earlier (observation, action) pairs, oldest first; the policy decides how many it shows."""


@dataclass(frozen=True, slots=True)
class ActResult:
    action: str
    """The parsed action string (exact admissible match -> fuzzy match -> raw text): what gates see."""
    text: str
    """The raw generated text."""
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    """Sampling log-probs of `token_ids` under the policy that generated them."""
    policy_version: int
    choices: list[list[int]] = field(default_factory=list)
    """The token sequences decoding was constrained to (`stages.policy.choices`); [] = unconstrained."""
    nucleus: list[int] = field(default_factory=list)
    """Each token's nucleus size at sampling (`stages.policy.sampling.nucleus_sizes`); [] = not recorded
    (no top-p, or a backend that does not report it: the learner then applies the top-p rule)."""


@runtime_checkable
class Policy(Protocol):
    version: int

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the batching loop until cancelled; call task_status.started() once requests are served."""
        ...

    async def act(self, context: AgentContext, *, greedy: bool = False, number: int | None = None) -> ActResult:
        """Generate one action. Cancelling the caller drops the request without disturbing the batch.

        `number` (default: the next in call order) names the request's random stream; a decoding worker
        process (`pipeline/run/decoding_pool.py`) passes the number its pool assigned, so results do not depend on
        which process answers. A backend that samples from a shared stream may ignore it."""
        ...

    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        """Queue new weights; they take effect between batches and later results carry `version`."""
        ...

    def trainable(self) -> TrainableModel:
        """A fresh trainable copy of the current model (for the learner, used off the Trio thread)."""
        ...

    # Optional: `attach_profiler(profiler: pipeline.profiling.Profiler) -> None`. A backend that has it
    # records its own `policy` spans (generate, weight_load) and binds its worker thread's CPU time.
