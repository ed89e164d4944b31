"""Contract types shared across the layers, kept in the mechanism layer so every arrow points down.

`stages/`, `gates/` and `learner/` import these from here (and never import each other's contracts):
a task (`Task`, what environments define and allocators choose among), an admission (`Admission`, an
allocator's choice), a gate's decision (`GateDecision`) and what the learner trains (`TrainableModel`,
scoring completions as `CompletionScores`). The old homes (`stages.envs.base`, `gates.allocators.base`,
`gates.prefix`, `stages.policy.base`) re-export them, so plugins written against those keep working.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str
    """Stable across runs and machines (e.g. `household/train/000123`)."""
    family: str
    """Task family, e.g. `pick_and_place`, `clean_then_place`."""
    description: str
    """What the agent is told: "put a clean mug in cabinet 1"."""
    split: str
    features: Mapping[str, float] = field(default_factory=dict)
    """Numeric task features allocators may use (room size, distractors, closed receptacles...)."""


@dataclass(frozen=True, slots=True)
class Admission:
    task_id: str
    size: int
    """Rollouts to run now for this prompt (slots taken)."""
    kind: str = "group"
    """What this admission is for: group, pilot, commit, explore, rescue..."""
    parent: int | None = None
    """Group id of an earlier rollout group of the same prompt this one extends (commit, rescue)."""


@dataclass(frozen=True, slots=True)
class GateDecision:
    """What a gate's `observe` (or `close`) returns about one group."""

    cut: bool
    """Cut the group now. Only a cut decision is acted on; a gate may also return non-cut ones (the gate stage
    counts and times every decision returned: `gate/decisions`)."""
    value: float
    """The statistic the gate measured (shown as `GroupResult.gate_value`, scored in shadow mode); a gate
    without a threshold puts whatever number explains its decision, e.g. 0.0."""
    checkpoint: int
    """The step at which it decided (`GroupResult.cut_checkpoint`); a gate without checkpoints puts the step
    count of the rollouts it saw."""
    reason: str
    """Readable why (`GroupResult.cut_reason`)."""



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

    def requires_grad_(self, requires_grad: bool = True) -> Any:
        """For the learner's frozen reference copy (`learner.kl_coef` > 0)."""
        ...

    def completion_logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        choices: Sequence[Sequence[Sequence[int]]] | None = None,
        nucleus: Sequence[Sequence[int]] | None = None,
    ) -> CompletionScores:
        """Per-token log-probs of each completion given its prompt, under the (temperature, top-p)
        distribution the rollouts sampled from (`stages.policy.sampling.sampled_logprobs`): at unchanged
        weights they equal the `ActResult.logprobs` recorded at sampling. T is the longest completion.
        `choices` (per completion, `ActResult.choices`) is passed only when some decoding was constrained
        (`stages.policy.choices`); a backend that cannot constrain decoding never receives it. `nucleus`
        (per completion, `ActResult.nucleus`: each token's nucleus size at sampling, [] = none recorded) is
        passed only when some turn recorded one: the token is then scored under that many most likely
        tokens, so the ratio is 1 at unchanged weights whatever the batch; a backend whose sampler does not
        report its nucleus (vLLM) never receives it."""
        ...
