"""Reading back what the trackers wrote, each with its own library's reader (no mocks), and the settings that
keep every tracker test off the network."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

OFFLINE = {
    "WANDB_MODE": "offline",  # W&B writes its run files and never uploads
    "WANDB_ERROR_REPORTING": "false",  # wandb-core's own error reports (--no-observability)
    "WANDB_SILENT": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
}


def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No tracker of the test reaches the network (W&B offline whatever a login says, no telemetry)."""
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def png(width: int = 3, height: int = 2) -> bytes:
    """A valid grey PNG of that size (what TensorBoard and W&B are given as an image)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([128] * width) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


# ---- TensorBoard: its event accumulator ----------------------------------------------------------------


def tensorboard(log_dir: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = tensorboard(log_dir)
    return {tag: [(s.step, s.value) for s in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


# ---- W&B: its own transaction-log reader (`wandb leet inspect --json`) --------------------------------


def wandb_files(run_dir: Path) -> list[Path]:
    """The run's .wandb transaction logs, oldest first (a resumed offline run writes a second one)."""
    return sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def wandb_records(path: Path) -> list[dict[str, Any]]:
    """Every record of one .wandb file, as wandb's reader prints it."""
    done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                          capture_output=True, text=True, timeout=120, env=os.environ | OFFLINE)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def wandb_history(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["history"]["item"] for r in records if r["type"] == "history"]


def wandb_run(records: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r["run"] for r in records if r["type"] == "run")


def wandb_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in records:
        if r["type"] == "summary":
            out |= r["summary"].get("update", {})
    return out


# ---- MLflow: its client on the run folder's store ------------------------------------------------------


def mlflow_client(run_dir: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{(run_dir / 'mlflow' / 'mlflow.db').resolve()}")


def mlflow_history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


# ---- a tracker plugin whose package is not installed ---------------------------------------------------


class NeedsAbsentPackage:
    """A tracker that needs a package no test environment has."""

    extra = "absent-extra"
    requires = ("rollcut_test_absent_package",)

    class Options(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        level: int = 1

    def __init__(self, options: Options, *, run: Any) -> None:
        raise AssertionError("never built: its package is missing")
