"""The agent loop, written once: reset -> (prompt -> `policy.act` -> env step -> record the turn) until done.

`play_episode` is what the rollout stage, evaluation and the benchmarks play. It fills an `Episode` in
place (so a cancelled or failing episode still shows the turns it took: a cut trajectory reports its work)
and returns it. What differs between callers comes in as arguments, not as copies of the loop:

* `greedy`: evaluation decodes greedily, training rollouts sample;
* `env_step`: how one step is taken (default: `env.step` on the Trio thread; the rollout stage passes one
  that runs it in a worker thread under a deadline, so a hung step fails its trajectory);
* `on_step`: awaited after every step with an `EpisodeStep` (the rollout streams a `StepEvent` from it,
  counts env steps; a benchmark counts steps); it runs before the loop decides to stop;
* `profiler`: `rollout/env_reset` and `rollout/env_step` spans when given.

The caller owns the environment (`suite.make()` ... `env.close()` in a `finally`) and any failure policy:
an exception from the environment or the policy propagates, and so does cancellation.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from pipeline.messages import Turn
from pipeline.profiling import Profiler
from stages.envs.base import Environment, StepResult, Task
from stages.policy.base import AgentContext, Policy

EnvStep = Callable[[Environment, str], Awaitable[StepResult]]
"""Takes one environment step for an action (e.g. in a worker thread under a deadline)."""


@dataclass(slots=True)
class Episode:
    """One episode as it is played, filled in place: after a cancel or a failure it holds what was done."""

    turns: list[Turn] = field(default_factory=list)
    """One per policy call, appended before the environment step it leads to."""
    reward: float = 0.0
    """Sum of the step rewards so far."""
    won: bool = False
    """The environment's verdict on the last step (set when the episode ends)."""
    done: bool = False
    """The episode ended: the environment said done, or `max_steps` steps were played."""

    @property
    def steps(self) -> int:
        return len(self.turns)


@dataclass(frozen=True, slots=True)
class EpisodeStep:
    """What one step did, as `on_step` sees it."""

    step_index: int
    turn: Turn
    """The policy call of this step (already in `Episode.turns`)."""
    result: StepResult
    reward: float
    """The episode's reward so far, this step included."""
    done: bool
    """This is the last step (the environment said done, or the step limit was reached)."""
    new_observation: bool
    """The observation after this step was never seen before in this episode (reset included)."""
    entropy: float | None = None
    """Entropy of the step's choice distribution (`ActResult.entropy`; None: the backend cannot tell)."""


async def _step_on_trio_thread(env: Environment, action: str) -> StepResult:
    return env.step(action)


def state_anchor(observation: str, admissible: Sequence[str]) -> str:
    """A short digest of what an agent faces at a step: its observation and admissible commands (`Turn.anchor`).

    GiGPO's anchor state: rollouts of one task that reach the same observation with the same commands on
    offer are taken to be in the same state, so their actions there can be compared."""
    digest = hashlib.blake2b(observation.encode(), digest_size=8)
    for command in admissible:
        digest.update(b"\x00" + command.encode())
    return digest.hexdigest()


def _span(profiler: Profiler | None, name: str) -> contextlib.AbstractContextManager[object]:
    return profiler.span("rollout", name) if profiler is not None else contextlib.nullcontext()


async def play_episode(
    policy: Policy,
    env: Environment,
    task: Task,
    max_steps: int,
    *,
    greedy: bool = False,
    episode: Episode | None = None,
    env_step: EnvStep = _step_on_trio_thread,
    on_step: Callable[[EpisodeStep], Awaitable[None]] | None = None,
    profiler: Profiler | None = None,
) -> Episode:
    """Play `task` on `env` (reset here) for at most `max_steps` steps; returns `episode` (a new one if None),
    filled in place as it goes. `policy.serve()` must be running."""
    episode = Episode() if episode is None else episode
    with _span(profiler, "env_reset"):
        observation = env.reset(task)
    history: list[tuple[str, str]] = []
    seen = {observation.text}
    for step_index in range(max_steps):
        context = AgentContext(task.description, observation.text, observation.admissible, tuple(history))
        act = await policy.act(context, greedy=greedy)
        turn = Turn(
            prompt_ids=act.prompt_ids,
            token_ids=act.token_ids,
            logprobs=act.logprobs,
            action=act.action,
            policy_version=act.policy_version,
            admissible=not observation.admissible or act.action in observation.admissible,
            choices=act.choices,
            anchor=state_anchor(observation.text, observation.admissible),
            nucleus=act.nucleus,
        )
        episode.turns.append(turn)
        with _span(profiler, "env_step"):
            result = await env_step(env, act.action)
        if result.reward:
            turn = episode.turns[-1] = msgspec.structs.replace(turn, reward=result.reward)
        episode.reward += result.reward
        done = result.done or step_index == max_steps - 1
        new_observation = result.observation.text not in seen
        if on_step is not None:
            await on_step(EpisodeStep(step_index, turn, result, episode.reward, done, new_observation, act.entropy))
        seen.add(result.observation.text)
        history.append((observation.text, act.action))
        observation = result.observation
        if done:
            episode.won, episode.done = result.won, True
            break
    return episode
