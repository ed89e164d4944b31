"""The held-out measure before GRPO, kept for the next run from the same warm start (`eval.reuse_before`).

Every arm of an A/B study starts each seed from the same cached warm start, and each measured it again before
GRPO (~160 s on 2 cores at 400 tasks per split). With `eval.reuse_before = true` the first run stores its
before figures in the policy's cache folder, keyed by the served weights and every setting the measure reads,
and the others read them back: a greedy measure of the same weights on the same tasks gives the same episodes.

The key holds the weights and the settings, not rollcut's code: after changing an environment's or a policy's
code, remove `<policy.cache_dir>/heldout-*.json` (or leave the option off, the default).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import RunConfig
from pipeline.contracts import TrainableModel

IGNORED_POLICY_KEYS = ("workers", "max_wait_ms", "cache_dir")
"""Policy settings that do not change a greedy measure's episodes: decoding processes give the same results as
one (docs/architecture.md, "Decoding processes"), the batcher's wait and the cache folder are not read."""


def weights_digest(model: TrainableModel) -> str:
    """A digest of the model's weights (names, dtypes, shapes and raw bytes)."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def before_key(cfg: RunConfig, weights: str) -> str:
    """What a before measure depends on: the weights, the environment, the policy's decoding, the measure's tasks."""
    policy = {k: v for k, v in msgspec.to_builtins(cfg.policy).items() if k not in IGNORED_POLICY_KEYS}
    measure = {k: msgspec.to_builtins(getattr(cfg.eval, k)) for k in ("tasks", "range", "ranges", "splits", "greedy")}
    blob = json.dumps({"weights": weights, "env": msgspec.to_builtins(cfg.env), "policy": policy, "eval": measure},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def path_for(cfg: RunConfig, key: str) -> Path:
    return Path(cfg.policy.cache_dir) / f"heldout-{key}.json"


def load_before(path: Path) -> dict[str, Any] | None:
    """The stored before figures (`summary.reports_to_json`'s form), or None: absent or unreadable (measured again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    reports = data.get("heldout_before") if isinstance(data, dict) else None
    return reports if isinstance(reports, dict) else None


def store_before(path: Path, reports: dict[str, Any], *, run_name: str) -> None:
    """Write the figures atomically (a concurrent run reads the whole file or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump({"measured_by": run_name, "heldout_before": reports}, f)
    os.replace(tmp, path)
