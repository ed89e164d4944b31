"""Fault-injection plugins for tests, loaded by `module:attr` through the normal registries (no test code
path in the production stages): an environment that raises or hangs on chosen steps, a policy whose
server dies, a loss that raises, and an observer stage that stops the run after N updates.

Switches are plugin options (`env.options`, `policy.options`, `[[stages]] options`), so a config turns
them on like any other plugin setting.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
from typing import Any

import msgspec
import trio

from pipeline.messages import WeightsPublished
from pipeline.stage import StageContext
from stages.envs.base import Observation, StepResult
from stages.envs.household import HouseholdSuite
from stages.policy.torch_tiny import TinyOptions, torch_tiny_backend

STOPS: dict[str, trio.Event] = {}
"""Events the `StopAfter` stage sets, by key (the test creates and awaits them)."""


class StopAfter:
    """Sets `STOPS[key]` once the learner has published `updates` weight versions."""

    name = "stop_after"

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        key: str
        updates: int = 1

    def __init__(self, options: Options) -> None:
        self.key, self.updates = options.key, options.updates

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        events = ctx.subscribe()
        async with events:
            task_status.started()
            async for message in events:
                if isinstance(message, WeightsPublished) and message.version >= self.updates:
                    STOPS[self.key].set()


class FillDisk:
    """Makes the run folder's next checkpoint write hit a full disk (its temporary file -> /dev/full)."""

    name = "fill_disk"

    async def run(self, ctx: StageContext, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        os.symlink("/dev/full", ctx.run_dir / "checkpoints" / ".state.pt.tmp")
        task_status.started()


class _FaultyEnv:
    def __init__(self, inner: Any, suite: FaultySuite) -> None:
        self._inner, self._suite = inner, suite
        self._steps = 0
        self._released = threading.Event()

    def reset(self, task: Any) -> Observation:
        self._steps = 0
        return self._inner.reset(task)

    def step(self, action: str) -> StepResult:
        self._steps += 1
        suite = self._suite
        with suite.lock:
            suite.steps += 1
            n = suite.steps
        if suite.raise_every and n % suite.raise_every == 0:
            with suite.lock:
                suite.raised += 1
            raise RuntimeError(f"injected env fault at step {n}")
        if suite.hang_every and n % suite.hang_every == 0:
            with suite.lock:
                suite.hung += 1
            self._released.wait()  # hangs until close() (the rollout's per-step timeout fires first)
            raise RuntimeError("released by close()")
        result = self._inner.step(action)
        if suite.random_reward and result.done:  # varied group rewards, so the learner has items to train on
            reward = float(suite.rng.random() < 0.5)
            result = dataclasses.replace(result, reward=reward, won=bool(reward))
        return result

    def close(self) -> None:
        self._released.set()  # a hung step() returns: its abandoned worker thread does not outlive the run
        self._inner.close()


class FaultySuite(HouseholdSuite):
    """The household suite whose episodes raise on every `raise_every`-th env step of the run and hang on
    every `hang_every`-th (0 = never); counts what it injected."""

    class Options(HouseholdSuite.Options, frozen=True, kw_only=True, forbid_unknown_fields=True):
        raise_every: int = 0
        hang_every: int = 0
        random_reward: bool = False

    def __init__(self, options: Options, *, max_steps: int) -> None:
        super().__init__(options, max_steps=max_steps)
        self.raise_every, self.hang_every, self.random_reward = options.raise_every, options.hang_every, options.random_reward
        self.rng = random.Random(0)
        self.lock = threading.Lock()
        self.steps = self.raised = self.hung = 0
        INSTANCES.append(self)

    def make(self) -> _FaultyEnv:
        return _FaultyEnv(super().make(), self)


INSTANCES: list[FaultySuite] = []


class DyingOptions(TinyOptions, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """torch_tiny's options and when its decoding worker dies."""

    die_after_batches: int = 3


def dying_policy(cfg: Any, pretrain: Any, suite: Any, *, seed: int) -> Any:
    """torch_tiny whose decoding worker raises after `policy.options.die_after_batches` batches."""
    options = dict(cfg.options)
    die_after = options.pop("die_after_batches", 3)
    import msgspec

    policy = torch_tiny_backend(msgspec.structs.replace(cfg, options=options), pretrain, suite, seed=seed)
    decode = policy._decode_in_worker
    batches = 0

    def dying(jobs: Any) -> Any:
        nonlocal batches
        batches += 1
        if batches > die_after:
            raise MemoryError("injected: the policy worker died")
        return decode(jobs)

    policy._decode_in_worker = dying
    return policy


dying_policy.Options = DyingOptions  # type: ignore[attr-defined]  # the backend's options (the plugin convention)


CLOSED: list[str] = []
"""What `closing_policy` policies recorded when the job closed them, one entry per `close()`."""
BUILT: list[str] = []
"""The `closing_policy` policies built, by the same names."""


def closing_policy(cfg: Any, pretrain: Any, suite: Any, *, seed: int) -> Any:
    """`dying_policy` (which dies only with `policy.options.die_after_batches`) with the optional `close()`
    hook a backend holding an engine (vllm) has: it records each call in `CLOSED`."""
    options = dict(cfg.options)
    options.setdefault("die_after_batches", 10**9)
    import msgspec

    policy = dying_policy(msgspec.structs.replace(cfg, options=options), pretrain, suite, seed=seed)
    policy.close = lambda: CLOSED.append(f"policy {id(policy)}")
    BUILT.append(f"policy {id(policy)}")
    return policy


closing_policy.Options = DyingOptions  # type: ignore[attr-defined]


def exploding_loss(*args: Any, **kwargs: Any) -> Any:
    """The clipped-ratio loss, except that the learner's 2nd update raises."""
    from learner.losses import LOSSES

    EXPLODING["calls"] += 1
    if EXPLODING["calls"] > EXPLODING["after"]:
        raise FloatingPointError("injected: loss is NaN")
    return LOSSES.get("clipped_ratio")(*args, **kwargs)


EXPLODING = {"calls": 0, "after": 1}


ENGINE_DIR = "ROLLCUT_TEST_ENGINE_DIR"
"""Where `engine_policy` marks its progress (`building`, `closed`) and names its engine process (inherited env)."""
ENGINE_MARK = "rollcut-test-engine"


class _EngineOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    start_s: float = 4.0
    """How long the engine takes to start (the window a test interrupts in)."""


class _EnginePolicy:
    """What a backend holding an engine leaves once built: a process of its own, ended by `close()`."""

    def __init__(self, engine: Any, folder: str) -> None:
        self.engine, self.folder = engine, folder

    def close(self) -> None:
        self.engine.kill()
        self.engine.wait()
        with open(os.path.join(self.folder, f"closed-{self.engine.pid}"), "w"):
            pass


def engine_policy(cfg: Any, pretrain: Any, suite: Any, *, seed: int) -> Any:
    """A backend like vLLM's as the run sees it starting: it starts its engine process at once (a child whose
    command line names `ENGINE_MARK` and the test's folder), then takes `start_s` to be ready (blocking, as
    AsyncLLM.from_engine_args does). The test interrupts in that window and looks for the engine process after."""
    import subprocess
    import sys
    import time

    folder = os.environ[ENGINE_DIR]
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", ENGINE_MARK, folder])
    with open(os.path.join(folder, f"building-{engine.pid}"), "w"):
        pass
    time.sleep(msgspec.convert(dict(cfg.options), _EngineOptions).start_s)
    return _EnginePolicy(engine, folder)


engine_policy.Options = _EngineOptions  # type: ignore[attr-defined]
engine_policy.auto_workers = 1  # type: ignore[attr-defined]  # one engine, in this process
