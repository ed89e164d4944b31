"""The policy's declared surface: optional hooks with no-op defaults, and one check of a backend's section."""

from __future__ import annotations

import msgspec

from pipeline.config import PolicySection
from stages.policy import POLICIES, PolicyHooks, check_backend


def test_every_optional_hook_has_a_no_op_default() -> None:
    hooks = PolicyHooks()
    hooks.attach_profiler(object())  # type: ignore[arg-type]
    hooks.load_sampling_state({"any": "state"})
    hooks.close()
    assert hooks.sampling_state() is None and hooks.statistics() is None


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
