"""The policy's declared surface (`Policy`: abstract core, optional hooks with no-op defaults, one statistics
record), the built-in backends held to it, and one check of a backend's section."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import msgspec
import pytest
import trio

from pipeline.config import PolicySection
from pipeline.run.decoding_pool import WorkerPoolPolicy
from stages.policy import POLICIES, Policy, PolicyStatistics, check_backend
from stages.policy.base import ActResult, AgentContext
from stages.policy.torch_tiny import TorchTinyPolicy
from stages.policy.vllm._server import VllmPolicy

BACKENDS = [TorchTinyPolicy, WorkerPoolPolicy, VllmPolicy]
SURFACE = [name for name, member in vars(Policy).items() if inspect.isfunction(member)]


class _Minimal(Policy):
    version = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def act(self, context: AgentContext, *, greedy: bool = False, number: int | None = None) -> ActResult:
        raise NotImplementedError

    def load_weights(self, version: int, state: Mapping[str, Any]) -> None:
        self.version = version

    def trainable(self) -> Any:
        raise NotImplementedError

    def statistics(self) -> PolicyStatistics:
        return PolicyStatistics(requests=0, answered=0, abandoned=0, generated_tokens=0, version=self.version)


def test_every_optional_hook_has_a_no_op_default() -> None:
    policy = _Minimal()
    policy.attach_profiler(object())  # type: ignore[arg-type]
    policy.load_sampling_state({"any": "state"})
    policy.close()
    assert policy.sampling_state() is None and policy.dropped_frames() == {}
    assert set(SURFACE) >= {"serve", "act", "load_weights", "trainable", "statistics", "attach_profiler",
                            "sampling_state", "load_sampling_state", "close", "dropped_frames"}


def test_a_backend_without_the_core_cannot_be_built() -> None:
    class NoStatistics(Policy):  # what the run needs and this one lacks is named at once, not mid-run
        async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...
        async def act(self, context: AgentContext, *, greedy: bool = False, number: int | None = None) -> ActResult: ...  # type: ignore[empty-body]
        def load_weights(self, version: int, state: Mapping[str, Any]) -> None: ...
        def trainable(self) -> Any: ...

    with pytest.raises(TypeError, match="statistics"):
        NoStatistics()  # type: ignore[abstract]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda cls: cls.__name__)
def test_each_built_in_backend_keeps_the_declared_surface(backend: type[Policy]) -> None:
    # The run-time half of the check (mypy in .ci/run checks the types): a subclass with nothing abstract
    # left, whose every override takes the declared parameters, and statistics() annotated with the record.
    assert issubclass(backend, Policy) and not backend.__abstractmethods__  # type: ignore[attr-defined]
    for name in SURFACE:
        declared, actual = inspect.signature(getattr(Policy, name)), inspect.signature(getattr(backend, name))
        assert [(p.name, p.kind, p.default) for p in actual.parameters.values()] == [
            (p.name, p.kind, p.default) for p in declared.parameters.values()
        ], f"{backend.__name__}.{name}{actual} drifted from Policy.{name}{declared}"
    assert inspect.signature(backend.statistics).return_annotation == "PolicyStatistics"


def test_an_unknown_backend_is_one_problem() -> None:
    assert check_backend(PolicySection(backend="nope")) == ["policy.backend: unknown policies 'nope' (known: hf, torch_tiny, vllm)"]


def test_every_problem_of_the_torch_tiny_section_is_listed_at_once() -> None:
    assert check_backend(PolicySection()) == []
    problems = check_backend(PolicySection(options={"layerz": 3, "max_prompt_tokens": 300, "choose_by": "command"}))
    assert problems[0].startswith("policy.options.layerz: unknown option for policy backend 'torch_tiny' (known: ")
    assert len(problems) == 1  # the cross checks wait until the table decodes
    problems = check_backend(PolicySection(options={"max_prompt_tokens": 300, "choose_by": "command"}))
    assert problems == [
        "policy.options: max_prompt_tokens (300) + policy.max_new_tokens (12) must not exceed max_len (256)",
        "policy.options.choose_by = 'command' needs choose_admissible = true",
    ]
    assert check_backend(PolicySection(options={"layers": "four"})) == ["policy.options.layers: Expected `int`, got `str`"]


class _Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    width: int = 1


def bare_backend(cfg, pretrain, suite, *, seed):  # noqa: ANN001, ANN201 (a plain function is a backend)
    raise AssertionError("checking never builds")


def optioned_backend(cfg, pretrain, suite, *, seed):  # noqa: ANN001, ANN201
    raise AssertionError("checking never builds")


optioned_backend.Options = _Options  # type: ignore[attr-defined]
optioned_backend.check = lambda cfg: [] if cfg.model else ["policy.model: needed"]  # type: ignore[attr-defined]


def test_a_plugin_backend_follows_the_options_convention() -> None:
    here = f"{__name__}:"
    assert check_backend(PolicySection(backend=here + "bare_backend")) == []
    assert check_backend(PolicySection(backend=here + "bare_backend", options={"x": 1})) == [
        f"policy.options: policy backend '{here}bare_backend' takes no options (got x)"
    ]
    assert check_backend(PolicySection(backend=here + "optioned_backend", options={"width": "w"})) == [
        "policy.options.width: Expected `int`, got `str`",
        "policy.model: needed",
    ]
    assert POLICIES.get(here + "optioned_backend") is optioned_backend
