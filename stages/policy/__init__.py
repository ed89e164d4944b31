"""Policy backends, registered in `POLICIES`.

A backend is a callable `build(cfg: PolicySection, pretrain: PretrainSection, suite: EnvSuite, *,
seed: int) -> Policy` (see `stages.policy.base`).
"""

from pipeline.registry import Registry

from .base import ActResult as ActResult
from .base import AgentContext as AgentContext
from .base import Policy as Policy
from .base import TrainableModel as TrainableModel

POLICIES = Registry(
    "policies",
    {
        "torch_tiny": "stages.policy.torch_tiny:build_policy",
        "vllm": "stages.policy.vllm:build_policy",
    },
)

__all__ = ["POLICIES", "ActResult", "AgentContext", "Policy", "TrainableModel"]
