"""Policy backends, registered in `POLICIES` (extended by the `rollcut.policies` entry-point group).

A backend is a `PolicyBackend` (see `stages.policy.base`): `backend(section, pretrain, suite, seed=...)`
builds the `Policy`, and its optional `Options` and `check` are read by `check_backend` only, which lists
every problem of a `[policy]` section without building anything (config validation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.plugins import option_problems
from pipeline.registry import Registry

from .base import ActResult as ActResult
from .base import AgentContext as AgentContext
from .base import Policy as Policy
from .base import PolicyBackend as PolicyBackend
from .base import PolicyStatistics as PolicyStatistics
from .base import PolicyStopped as PolicyStopped
from .base import TrainableModel as TrainableModel

if TYPE_CHECKING:
    from pipeline.config import PolicySection

POLICIES = Registry(
    "policies",
    {
        "torch_tiny": "stages.policy.torch_tiny:torch_tiny_backend",
        "vllm": "stages.policy.vllm:vllm_backend",
        "hf": "stages.policy.hf:hf_backend",
    },
)


def check_backend(section: PolicySection) -> list[str]:
    """Every problem with `[policy] backend = ...` and its section, as readable lines (empty when fine): an
    unknown backend; else each unknown, mistyped or out-of-range `policy.options` key (the backend's
    `Options`, `pipeline.plugins.option_problems`), then what only the backend knows (its `check`)."""
    try:
        backend = POLICIES.get(section.backend)
    except LookupError as exc:
        return [f"policy.backend: {exc}"]
    problems = option_problems(backend, section.options, "policy.options", f"policy backend {section.backend!r}")
    check = getattr(backend, "check", None)  # optional (`PolicyBackend.check`), as `Options` is to option_problems
    return problems + (check(section) if check is not None else [])


def backend_auto_workers(section: PolicySection) -> int | None:
    """The decoding workers `policy.workers = "auto"` makes with this section's backend, when the backend
    fixes it (`PolicyBackend.auto_workers`); None: count the cores."""
    return getattr(POLICIES.get(section.backend), "auto_workers", None)  # optional, as `check` is above


def backend_top_p(section: PolicySection) -> float:
    """The top-p the run samples and scores with: `policy.top_p`, or 1.0 (no nucleus) for a backend that records
    none (`PolicyBackend.records_nucleus`)."""
    return section.top_p if getattr(POLICIES.get(section.backend), "records_nucleus", True) else 1.0


__all__ = [
    "POLICIES",
    "ActResult",
    "AgentContext",
    "Policy",
    "PolicyBackend",
    "PolicyStatistics",
    "PolicyStopped",
    "TrainableModel",
    "backend_auto_workers",
    "backend_top_p",
    "check_backend",
]
