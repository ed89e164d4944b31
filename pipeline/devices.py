"""Where the embedded policy and its learner run: `policy.device` and `learner.device`; and how many decoding
workers `policy.workers = "auto"` makes on this machine.

    auto      CUDA (the current device) when torch sees one, else the CPU
    cpu       the CPU: what every run did before these options existed
    cuda      the current CUDA device
    cuda:N    CUDA device N

A machine without CUDA resolves `auto` to the CPU, so such runs are exactly what they were. `cuda` /
`cuda:N` on a machine that lacks it is a configuration error (`device_problems`), found before the warm
start. Weights cross devices as CPU tensors: what the learner publishes, what checkpoints hold and what
decoding processes receive are on the CPU, and each side moves them where it computes.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

MAX_AUTO_WORKERS = 8
"""The most decoding workers "auto" makes: on 16 cores (one H100) 8 made 3.96-5.29x one (docs/scaling.md)."""


def auto_workers(cores: int) -> int:
    """Decoding workers for `policy.workers = "auto"` on `cores` cores: every core of one or two (on 2 cores 2
    workers made 186 env-steps/s against 111 with 1), half of more (the learner, the coordinator and the
    environments use the rest), at most MAX_AUTO_WORKERS."""
    return max(1, cores) if cores <= 2 else min(cores // 2, MAX_AUTO_WORKERS)


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_SPEC = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def device_problems(spec: str, where: str) -> list[str]:
    """Problems with a device option at config path `where`: its form, and CUDA that is not there."""
    if not _SPEC.match(spec):
        return [f"{where} must be auto, cpu, cuda or cuda:N, not {spec!r}"]
    if not spec.startswith("cuda"):
        return []
    import torch

    if not torch.cuda.is_available():
        return [f"{where} = {spec!r} but torch sees no CUDA device (torch {torch.__version__}); use auto or cpu"]
    index = int(spec.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        return [f"{where} = {spec!r} but torch sees {torch.cuda.device_count()} CUDA device(s)"]
    return []


def resolve_device(spec: str) -> Any:
    """The `torch.device` a device option names (`auto`: CUDA when torch sees it, else the CPU)."""
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


@contextlib.contextmanager
def side_stream(device: Any, stream: Any) -> Iterator[None]:
    """On CUDA, run the block on `stream` (after the work already queued on the current stream), so the
    CUDA events of a stage's spans time that stage's kernels only, not another thread's queued on the
    default stream; on the CPU, nothing."""
    if device.type != "cuda" or stream is None:
        yield
        return
    import torch

    with torch.cuda.device(device):
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            yield


def new_stream(device: Any) -> Any:
    """A CUDA stream on `device` for `side_stream` (None on the CPU)."""
    if device.type != "cuda":
        return None
    import torch

    return torch.cuda.Stream(device=device)
