"""The policy contract: batched, cancellation-safe `act()` plus versioned weight loading.

A backend (a `PolicyBackend`, registered in `stages.policy.POLICIES`) builds a `Policy` for a suite; the
runtime starts its `serve()` loop in a nursery, trajectories call `act()` concurrently, and the learner gets
a trainable copy of the same model through `trainable()` and sends weights back with `load_weights()`.
`Policy` declares everything the run may call on a policy, the optional hooks included (each with a no-op
default), and its `statistics()` returns the one `PolicyStatistics` record; everything the run may ask a
backend besides building is declared in `PolicyBackend`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import msgspec
import trio

from pipeline import plugins
from pipeline.contracts import (
    CompletionScores as CompletionScores,  # re-exported: contracts live in pipeline/
)
from pipeline.contracts import TrainableModel as TrainableModel

if TYPE_CHECKING:
    from pipeline.config import PolicySection, PretrainSection
    from pipeline.profiling import Profiler
    from stages.envs.base import EnvSuite


class PolicyStopped(RuntimeError):
    """`act()` was called while `serve()` is not running, or `serve()` exited before answering (every
    backend and the decoding pool raise this one class)."""


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
    entropy: float | None = None
    """Entropy (nats) of the step's choice distribution: over the admissible commands when one is drawn whole,
    else the mean over the generated tokens of each token's sampling distribution; None = not known (vLLM
    returns only the sampled token's log-prob). An early signal for gates (`StepEvent.entropy`)."""


@dataclass(frozen=True, slots=True)
class PolicyStatistics:
    """What a policy did so far (`Policy.statistics()`): the one record every backend returns. The first five
    figures every backend counts; the rest belong to one backend each (None elsewhere)."""

    requests: int
    """`act()` calls taken."""
    answered: int
    """Requests answered with a result."""
    abandoned: int
    """Requests whose caller stopped waiting first (a cut group's turns, a cancelled evaluation)."""
    generated_tokens: int
    """Tokens decoded for answered requests (what the summary, the held-out rows and the A/B's tokens-to-target
    read)."""
    version: int
    """The weights' version now serving."""
    batches: int | None = None
    """torch_tiny: decoding batches run (a request abandoned while queued is never decoded)."""
    workers: int | None = None
    """The decoding pool: its worker processes."""
    round_trip_p50_s: float | None = None
    """The decoding pool: an answered `act()` from request to reply (None before the first)."""
    round_trip_p99_s: float | None = None
    abort_p50_s: float | None = None
    """vllm: a cancelled request from the caller's cancel to the engine's abort (None before the first)."""
    abort_p99_s: float | None = None
    weight_syncs: int | None = None
    """vllm: weight versions synced into the engine."""
    weight_sync_p50_s: float | None = None
    weight_sync_max_s: float | None = None


class Policy(ABC):
    """What the run needs of a policy, declared once: `serve`, `act`, `load_weights`, `trainable` and
    `statistics` (abstract: every backend has them), and the optional hooks, each with a no-op default
    that a backend overrides where it has something to do. The run calls each method directly (never
    through `getattr`); a backend subclasses this class, and mypy (`.ci/run`) checks every override's
    signature against it (tests/stages/policy/test_base.py checks the built-in backends at run time too)."""

    version: int
    """The weights' version now serving (0 until the first `load_weights`); results carry it."""

    @abstractmethod
    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the batching loop until cancelled; call task_status.started() once requests are served."""

    @abstractmethod
    async def act(self, context: AgentContext, *, greedy: bool = False, number: int | None = None) -> ActResult:
        """Generate one action. Cancelling the caller drops the request without disturbing the batch.

        `number` (default: the next in call order) names the request's random stream; a decoding worker
        process (`pipeline/run/decoding_pool.py`) passes the number its pool assigned, so results do not depend on
        which process answers. A backend that samples from a shared stream may ignore it."""

    @abstractmethod
    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        """Queue new weights; they take effect between batches and later results carry `version`."""

    @abstractmethod
    def trainable(self) -> TrainableModel:
        """A fresh trainable copy of the current model (for the learner, used off the Trio thread)."""

    @abstractmethod
    def statistics(self) -> PolicyStatistics:
        """Called by the run's summary, its metrics rows and benchmarks, on the Trio thread, at any time: what
        the policy did so far (trio's `statistics()` convention)."""

    # Optional hooks: each a no-op until a backend overrides it.

    def attach_profiler(self, profiler: Profiler) -> None:  # noqa: B027 (optional: empty on purpose)
        """Called once by the GRPO phase (`pipeline/run/grpo.py`), before its first rollout, with the run's
        profiler: a backend that overrides it records its own `policy` spans (generate, weight_load) and
        binds its worker thread's CPU time. Default: nothing is recorded."""

    def sampling_state(self) -> Any:
        """Called at every checkpoint (`pipeline/run/updates.py:checkpoint_state`) on the Trio thread: the
        backend's own sampling state (e.g. a shared random stream), saved under `policy` in the checkpoint
        (`pipeline/run/resume.py`) and handed back to `load_sampling_state` on resume. Default: None,
        nothing to save (a backend that seeds each request from `(seed, number)` has no state)."""
        return None

    def load_sampling_state(self, state: Any) -> None:  # noqa: B027 (optional: empty on purpose)
        """Called once when a run resumes (`pipeline/run/job.py`), after the checkpoint's weights are loaded
        and before `serve()` starts, with what `sampling_state()` returned (never None). Default: nothing."""

    def close(self) -> None:  # noqa: B027 (optional: empty on purpose)
        """Called once when the run ends (`pipeline/run/job.py`, off the Trio thread, after `serve()` has
        returned), also when it failed: release what outlives the process's objects (vllm shuts its engine
        down and stops its loop thread). A close that raises is logged; the run still ends. Default: nothing
        to release."""

    def dropped_frames(self) -> dict[str, dict[str, int]]:
        """Called by the GRPO phase (`pipeline/run/grpo.py`) with every metrics row and at its end: the frames
        a backend's own sockets dropped, by socket and reason (`pipeline.transport.Context.dropped_frames`),
        counted with the run's own in `dropped_frames`. Default: none (a backend without sockets)."""
        return {}


class PolicyBackend(Protocol):
    """A policy backend: what `stages.policy.POLICIES` holds (or what a config names as `module:attr`).

    Calling it builds the `Policy` for a suite, blocking (the run calls it off the Trio thread), and raises
    ValueError for a section it cannot build. Besides, it follows the plugin convention of
    `pipeline.plugins` with two optional attributes, read by `stages.policy.check_backend` only (which
    `run.py check` and the start of every run call); a plain function is a backend without them.
    """

    Options: ClassVar[type[msgspec.Struct] | None] = None
    """Optional: the strict Struct `policy.options` decodes into (`pipeline.plugins.option_problems` lists
    each unknown, mistyped or out-of-range key); absent or None, the backend takes no options."""

    auto_workers: ClassVar[int | None] = None
    """Optional: the decoding workers `policy.workers = "auto"` makes with this backend on one machine; absent
    or None, from the cores (`pipeline.devices.auto_workers`). vllm: 1, since its engine batches every
    request of the run itself and a second engine on the same device would claim the memory the first holds."""

    records_nucleus: ClassVar[bool] = True
    """Optional: whether each sampled token's nucleus is recorded (`Turn.nucleus`) for the learner to score under.
    False (vllm: the engine reports none): the run samples and scores this backend without a nucleus
    (`stages.policy.backend_top_p` is 1.0 whatever `policy.top_p` says), since a top-p boundary recomputed by
    the learner would make a turn's log-prob depend on the batch it is scored in."""

    def __call__(self, section: PolicySection, pretrain: PretrainSection, suite: EnvSuite, *, seed: int) -> Policy:
        """The backend's policy for `suite`, warm-started from `pretrain` if the backend does that."""
        ...

    def trainable(self, section: PolicySection, pretrain: PretrainSection, suite: EnvSuite, *, seed: int) -> TrainableModel:
        """Optional: the model to train alone, with nothing served, for a run whose decoding happens in worker
        processes or Ray actors (`pipeline/run/build.py`: the coordinator trains, the workers serve). vllm: the
        model directory as a `transformers` model, so that no engine starts where nothing decodes. Absent, the
        run builds the backend and takes its policy's `trainable()` (torch_tiny: after its warm start)."""
        ...

    def check(self, section: PolicySection) -> list[str]:
        """Optional: every problem of `section` only the backend knows (vllm: its install, the model
        directory; options that do not fit the rest of the section), as readable lines. Called after the
        options were checked against `Options`, and also when they did not decode: then it checks what it
        can without them. Absent, there is nothing more to check."""
        return []


def decode_backend_options(backend: Any, name: str, options: Mapping[str, Any], max_new_tokens: int,
                           section_problems: Callable[[Any, int], list[str]]) -> Any:
    """`policy.options` decoded strictly into `backend.Options` (the plugin convention) and checked against the
    rest of the `[policy]` section by `section_problems(options, max_new_tokens)`.

    Raises:
        ValueError: every problem listed.
    """
    opts = plugins.decode_options(backend, dict(options), "policy.options", f"policy backend {name!r}")
    problems = section_problems(opts, max_new_tokens)
    if problems:
        raise ValueError("; ".join(problems))
    return opts
