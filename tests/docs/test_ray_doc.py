"""docs/ray.md and the Ray modules say where a pickled object reaches rollcut (a failed actor's
`RayTaskError.cause`) and why it is accepted (Ray's trusted-cluster model), instead of claiming none does."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_ray_failure_path_is_documented_under_the_trusted_cluster_model():
    page = _normalised((ROOT / "docs" / "ray.md").read_text())
    assert "## Security" in (ROOT / "docs" / "ray.md").read_text()
    assert "RayTaskError" in page and "trusted-cluster model" in page
    assert "rollcut itself never unpickles what it receives" not in page  # false: Ray unpickles the cause for it
    for module in ("pipeline/run/ray_coordinator.py", "pipeline/run/ray_launch.py"):
        doc = _normalised((ROOT / module).read_text().split('"""', 2)[1])
        assert "RayTaskError" in doc and "trusted-cluster model" in doc, module
        assert "never an exception or any other pickled object" not in doc, module
