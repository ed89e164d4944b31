"""The policy contract: batched, cancellation-safe `act()` plus versioned weight loading.

A backend (registered in `stages.policy.POLICIES`) builds a `Policy` for a suite; the runtime starts its
`serve()` loop in a nursery, trajectories call `act()` concurrently, and the learner gets a trainable copy
of the same model through `trainable()` and sends weights back with `load_weights()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
import trio


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


class CompletionScores(NamedTuple):
    """What a trainable model says about completions under the rollouts' sampling distribution."""

    logprobs: torch.Tensor
    """[N, T] log mu(token) (differentiable); 0 on padding."""
    mask: torch.Tensor
    """[N, T] 1.0 on real completion tokens."""
    entropy: torch.Tensor
    """[N, T] entropy of the sampling distribution at each completion position (detached); 0 on padding."""


@runtime_checkable
class TrainableModel(Protocol):
    """What the learner trains: a torch module that scores completions."""

    def parameters(self) -> Iterator[torch.nn.Parameter]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def train(self, mode: bool = True) -> Any: ...

    def completion_logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        choices: Sequence[Sequence[Sequence[int]]] | None = None,
    ) -> CompletionScores:
        """Per-token log-probs of each completion given its prompt, under the (temperature, top-p)
        distribution the rollouts sampled from (`stages.policy.sampling.sampled_logprobs`): at unchanged
        weights they equal the `ActResult.logprobs` recorded at sampling. T is the longest completion.
        `choices` (per completion, `ActResult.choices`) is passed only when some decoding was constrained;
        a backend that cannot constrain decoding never receives it."""
        ...


@runtime_checkable
class Policy(Protocol):
    version: int

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the batching loop until cancelled; call task_status.started() once requests are served."""
        ...

    async def act(self, context: AgentContext, *, greedy: bool = False, number: int | None = None) -> ActResult:
        """Generate one action. Cancelling the caller drops the request without disturbing the batch.

        `number` (default: the next in call order) names the request's random stream; a decoding worker
        process (`stages/policy/workers.py`) passes the number its pool assigned, so results do not depend on
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
