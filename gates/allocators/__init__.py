"""Streaming allocators: who gets rollout slots (pre-rollout) and which groups train (post-rollout)."""

from pipeline.registry import Registry

from .base import Admission as Admission
from .base import Allocator as Allocator
from .base import AllocatorContext as AllocatorContext

ALLOCATORS = Registry(
    "allocators",
    {
        "uniform": "gates.allocators.uniform:UniformAllocator",
    },
)

__all__ = ["ALLOCATORS", "Admission", "Allocator", "AllocatorContext"]
