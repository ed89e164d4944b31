"""The one place a `RunConfig` becomes components: the environment suite, the policy backend (behind its
decoding processes or not), the trainer, the allocator, the gate and its stage, the learner stage and the
custom stages.

The main process and every child it launches (`pipeline/run/launch.py`: the gate stage, the learner stage,
the decoding workers) build from the one config they were given, through these functions, so a component
is built the same way wherever it runs. Nothing here starts anything: building is cheap and synchronous
apart from the warm start of `backend`.

Each function is named by what it builds, and called through the module: `build.suite(cfg)`,
`build.policy(cfg, suite)`, `build.gate(cfg)`, `build.trainer(cfg, model)`. (The registry-level builders,
by a configured name, are `gates.build_gate`, `gates.allocators.build_allocator`, `stages.envs.build_suite`.)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from typing import Any

import msgspec

from gates import build_gate
from gates.allocators import Allocator, AllocatorContext, build_allocator
from gates.base import Gate
from learner.losses import LOSSES
from learner.stage import LearnerStage, ReportSink
from learner.trainer import Trainer
from pipeline.config import PretrainSection, RunConfig
from pipeline.devices import auto_workers, available_cores
from pipeline.stage import Stage, build_stage
from stages import envs
from stages.envs import EnvSuite, Task
from stages.gate_stage import GateStage
from stages.policy import POLICIES, Policy, TrainableModel, backend_auto_workers, backend_top_p

from .decoding_pool import WorkerPoolPolicy
from .launch import Launcher, LocalLauncher


def suite(cfg: RunConfig) -> EnvSuite:
    return envs.build_suite(cfg.env.name, cfg.env.options, max_steps=cfg.env.max_steps)


def backend(cfg: RunConfig, suite: EnvSuite, *, warm_start: bool = True) -> Policy:
    """The configured policy backend in this process (`warm_start` False: its untrained weights, for a
    process that loads the run's weights next: a resumed run, a learner or decoding child)."""
    return POLICIES.get(cfg.policy.backend)(cfg.policy, _pretrain(cfg, warm_start), suite, seed=cfg.run.seed)


def trainable_source(cfg: RunConfig, suite: EnvSuite, *, warm_start: bool = True) -> Callable[[], TrainableModel]:
    """Fresh trainable copies of the run's model, for the coordinator of a pool of decoders: the backend's
    `trainable` hook when it has one (vllm: no engine starts here), else the backend built here (torch_tiny:
    with its warm start) and its policy's `trainable()`."""
    hook = getattr(POLICIES.get(cfg.policy.backend), "trainable", None)  # optional (`PolicyBackend.trainable`)
    if hook is not None:
        return partial(hook, cfg.policy, _pretrain(cfg, warm_start), suite, seed=cfg.run.seed)
    return backend(cfg, suite, warm_start=warm_start).trainable


def _pretrain(cfg: RunConfig, warm_start: bool) -> PretrainSection:
    return cfg.pretrain if warm_start else msgspec.structs.replace(cfg.pretrain, enabled=False)


def policy(cfg: RunConfig, suite: EnvSuite, *, warm_start: bool = True, workers: int | None = None) -> Policy:
    """The run's policy: the backend, behind a pool of decoding workers when `policy.workers` (or `workers`)
    > 1, or on Ray whenever the caller did not ask for `workers` (`decoding_pool.py`; each worker builds its
    backend with `backend`: `decoding_worker.py`; this process keeps only what it trains,
    `trainable_source`). `workers=1`: this process decodes, wherever the run's decoders are."""
    on_ray = cfg.placement.launcher == "ray" and workers is None
    workers = decoding_workers(cfg) if workers is None else workers
    if workers <= 1 and not on_ray:
        return backend(cfg, suite, warm_start=warm_start)
    return WorkerPoolPolicy(trainable_source(cfg, suite, warm_start=warm_start), cfg, workers=workers,
                            launcher=launcher(cfg))


def decoding_workers(cfg: RunConfig) -> int:
    """`policy.workers`, with "auto" resolved: on Ray (joined: inside `cluster(cfg)`) from how many
    `[placement.decoder]` bundles the cluster holds; else what the backend fixes (vllm: 1), or from the cores
    this process may use."""
    if cfg.policy.workers != "auto":
        return cfg.policy.workers
    if cfg.placement.launcher == "ray":
        from .ray_launch import auto_decoders

        return auto_decoders(cfg)
    fixed = backend_auto_workers(cfg.policy)
    return auto_workers(available_cores()) if fixed is None else fixed


def launcher(cfg: RunConfig) -> Launcher:
    """How the run's children start (`placement.launcher`): child processes, or Ray actors."""
    if cfg.placement.launcher == "ray":
        from .ray_launch import RayLauncher  # Ray is an optional extra: imported only when asked for

        return RayLauncher(cfg.placement)
    return LocalLauncher()


@contextlib.asynccontextmanager
async def cluster(cfg: RunConfig) -> AsyncIterator[None]:
    """The job's cluster for its whole life: none locally; on Ray, this process joined to `placement.address`."""
    if cfg.placement.launcher != "ray":
        yield
        return
    from .ray_launch import joined

    async with joined(cfg.placement):
        yield


def train_tasks(cfg: RunConfig, suite: EnvSuite) -> list[Task]:
    """The tasks GRPO draws prompts from: the train split, its first `env.train_tasks` if set."""
    train = list(suite.tasks("train"))
    return train[: cfg.env.train_tasks] if cfg.env.train_tasks else train


def allocator(cfg: RunConfig, train: list[Task]) -> Allocator:
    context = AllocatorContext(tasks=train, group_size=cfg.rollout.group_size, batch_groups=cfg.learner.batch_groups,
                               seed=cfg.run.seed)
    return build_allocator(cfg.allocator.name, cfg.allocator.options, context)


def trainer(cfg: RunConfig, model: Any, state: Mapping[str, Any] | None = None) -> Trainer:
    """The trainer of `model` (a policy's `trainable()`); `state` (a checkpoint's or the parent's trainer
    state) is loaded into it: its model weights first, since the KL reference copies the weights it starts with."""
    if state is not None:
        model.load_state_dict(state["model"])
    built = Trainer(model, cfg.learner, LOSSES.get(cfg.learner.loss), temperature=cfg.policy.temperature,
                    top_p=backend_top_p(cfg.policy), seed=cfg.run.seed, total_updates=cfg.run.updates)
    if state is not None:
        built.load_state_dict(dict(state))
    return built


def gate(cfg: RunConfig) -> Gate:
    """The configured gate, `gate.k` / `gate.tau` / `gate.checkpoints` folded into its options."""
    return build_gate(cfg.gate.name, cfg.gate.gate_options())


def gate_stage(cfg: RunConfig, counters: Mapping[str, Any] | None = None) -> GateStage:
    """The gate stage of `[gate]`; `counters`: a resumed run's (its statistics go on from them)."""
    stage = GateStage(gate(cfg), shadow=cfg.gate.shadow)
    if counters is not None:
        stage.load_counters(counters)
    return stage


def learner_stage(cfg: RunConfig, trainer: Trainer, reports: ReportSink, *, version: int, capture_state: bool,
                        announced_on_socket: bool) -> LearnerStage:
    return LearnerStage(trainer, cfg.learner, reports=reports, version=version, capture_state=capture_state,
                        announced_on_socket=announced_on_socket, last_version=cfg.run.updates)


def observers(cfg: RunConfig) -> list[Stage]:
    """The custom stages of `[[stages]]` that run in this process, in order (one with `process = true` is built
    in its own: `stage_children.serve_custom`)."""
    return [build_stage(spec.target, spec.options, f"stages[{i}].options") for i, spec in enumerate(cfg.stages)
            if not spec.process]
