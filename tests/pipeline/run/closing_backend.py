"""A policy backend for tests: torch_tiny whose `close()` leaves a file, so that a test sees that a decoding
worker released its backend when it was stopped (`decoding_worker.serve_decoder`)."""

from __future__ import annotations

import os
from pathlib import Path

from stages.policy.torch_tiny import TorchTinyPolicy, torch_tiny_backend

CLOSED_DIR = "ROLLCUT_TEST_CLOSED_DIR"
"""Where each closed policy writes `closed-<pid>` (inherited by the decoding workers from the test's environment)."""


class _Closing(TorchTinyPolicy):
    def close(self) -> None:
        (Path(os.environ[CLOSED_DIR]) / f"closed-{os.getpid()}").touch()


def closing_backend(*args, **kwargs) -> TorchTinyPolicy:  # noqa: ANN002, ANN003 (torch_tiny_backend's)
    policy = torch_tiny_backend(*args, **kwargs)
    policy.__class__ = _Closing  # the same object, with a close that says it ran
    return policy


closing_backend.Options = torch_tiny_backend.Options  # type: ignore[attr-defined]
