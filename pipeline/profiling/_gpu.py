"""GPU sampling through NVML (`pynvml`, from the nvidia-ml-py package) and CUDA-event spans.

NVML reports, per device, the percentage of time over its last internal sample period (1/6 s to 1 s,
device dependent) during which a kernel ran, and the memory in use. `GpuSampler` polls it at
`gpu_sample_hz`; each reading is taken to hold over the interval since the previous one. Without the
library, a driver or a device, the sampler says why in `status` and records nothing: no GPU numbers are
ever invented.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import structlog
import trio

from ._attribution import attribute_gpu
from ._recorder import BUSY, Recorder, Snapshot

log = structlog.get_logger(__name__)

Clock = Callable[[], float]

NO_GPU = "n/a (no GPU)"


@dataclass
class GpuTrack:
    """One device's readings: utilization samples (t0, t1, fraction busy) and memory (t, MiB used)."""

    index: int
    name: str
    total_mib: float
    uuid: str = ""
    util: list[tuple[float, float, float]] = field(default_factory=list)
    mem_mib: list[tuple[float, float]] = field(default_factory=list)


def _load_nvml() -> ModuleType:
    import pynvml  # nvidia-ml-py; optional extra "gpu-profile"

    return pynvml


class GpuSampler:
    """Polls NVML for every visible device. `nvml` is the pynvml module (injectable for tests)."""

    def __init__(self, hz: float, clock: Clock, nvml: ModuleType | None = None) -> None:
        self.period = 1.0 / hz if hz > 0 else 0.0
        self.clock = clock
        self._nvml = nvml
        self._handles: list[Any] = []
        self._initialised = False
        self.tracks: list[GpuTrack] = []
        self.status = "n/a (not sampled)"

    @property
    def available(self) -> bool:
        return bool(self.tracks)

    def open(self) -> bool:
        """Initialise NVML and find the devices; on any failure set `status` to the reason and return False."""
        if self.period == 0.0:
            self.status = "n/a (GPU sampling off)"
            return False
        try:
            nvml = self._nvml if self._nvml is not None else _load_nvml()
        except ImportError:
            self.status = f"{NO_GPU}: pynvml not installed (pip install nvidia-ml-py)"
            return False
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError has a subclass per cause; each means no GPU here
            self.status = f"{NO_GPU}: NVML unavailable ({exc})"
            return False
        self._nvml = nvml
        self._initialised = True
        try:
            count = nvml.nvmlDeviceGetCount()
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml.nvmlDeviceGetName(handle)
                name = name.decode() if isinstance(name, bytes) else str(name)
                total = nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20
                self._handles.append(handle)
                self.tracks.append(GpuTrack(index=index, name=name, total_mib=total, uuid=_uuid(nvml, handle)))
        except Exception as exc:  # a broken driver is reported, not raised
            self.status = f"{NO_GPU}: NVML device query failed ({exc})"
            self.tracks = []
            self.close()
            return False
        if not self.tracks:
            self.status = f"{NO_GPU}: NVML sees no device"
            self.close()
            return False
        self.status = f"{len(self.tracks)} device(s): " + ", ".join(t.name for t in self.tracks)
        return True

    def close(self) -> None:
        """Shut NVML down if `open` initialised it (idempotent); recorded tracks are kept."""
        if self._initialised:
            self._initialised = False
            self._handles = []
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # a failed shutdown changes nothing we recorded
                log.warning("nvml_shutdown_failed", error=str(exc))

    def read(self) -> list[tuple[float, float]]:
        """(utilization fraction, MiB used) per device, now. Blocking NVML calls: run in a worker thread."""
        out = []
        for handle in self._handles:
            util = self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            used = self._nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            out.append((util, used))
        return out

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample until cancelled. Reports started once NVML is open (or known to be unavailable)."""
        limiter = trio.CapacityLimiter(1)
        opened = await trio.to_thread.run_sync(self.open, limiter=limiter)
        task_status.started()
        if not opened:
            log.info("gpu_sampling_unavailable", status=self.status)
            return
        try:
            prev = self.clock()
            while True:
                await trio.sleep(self.period)
                readings = await trio.to_thread.run_sync(self.read, limiter=limiter)
                now = self.clock()
                for track, (util, used) in zip(self.tracks, readings, strict=True):
                    track.util.append((prev, now, util))
                    track.mem_mib.append((now, used))
                prev = now
        finally:
            self.close()


def _uuid(nvml: ModuleType, handle: Any) -> str:
    """The device's UUID ("GPU-..."), "" where the NVML binding has none."""
    try:
        uuid = nvml.nvmlDeviceGetUUID(handle)
    except Exception:  # an NVML without the call (or a test double) just matches devices by index
        return ""
    return uuid.decode() if isinstance(uuid, bytes) else str(uuid)


def cuda_available() -> bool:
    """True when torch is already imported and sees a CUDA device (torch is never imported here)."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_available())


class CudaSpan:
    """A busy span plus a pair of CUDA events on the current stream (of the current device), timed when the
    profile finishes; the span's wall interval and device are kept for the GPU rule (`attribute_gpu`)."""

    __slots__ = ("_buf", "_clock", "_device", "_end", "_name", "_span", "_stage", "_start", "_t0")

    def __init__(self, recorder: Recorder, stage: str, name: str, span: Any) -> None:
        self._buf = recorder.buffer()
        self._clock = recorder.clock
        self._stage = stage
        self._name = name
        self._span = span

    def __enter__(self) -> CudaSpan:
        import torch

        self._span.__enter__()
        self._device = torch.cuda.current_device()
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._t0 = self._clock()
        self._start.record()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._end.record()
        t1 = self._clock()
        self._span.__exit__(*exc_info)
        self._buf.cuda.append((self._stage, self._name, self._start, self._end, self._device, self._t0, t1))


def cuda_times(buffers: list[Any]) -> dict[int, list[tuple[str, float, float, float]]]:
    """Per CUDA device index, every recorded CUDA span as (stage, wall t0, wall t1, CUDA-event seconds)
    (synchronizes on each end event)."""
    out: dict[int, list[tuple[str, float, float, float]]] = {}
    for buf in buffers:
        for stage, _name, start, end, device, t0, t1 in list(buf.cuda):
            end.synchronize()
            out.setdefault(device, []).append((stage, t0, t1, start.elapsed_time(end) / 1000.0))
    return out


def cuda_seconds(times: dict[int, list[tuple[str, float, float, float]]]) -> dict[str, float]:
    """Total CUDA-event time per stage over every device (`cuda_times`)."""
    out: dict[str, float] = {}
    for spans in times.values():
        for stage, _t0, _t1, seconds in spans:
            out[stage] = out.get(stage, 0.0) + seconds
    return out


def nvml_index(track_uuids: list[str], cuda_index: int) -> int:
    """The NVML track of CUDA device `cuda_index`: matched by UUID when NVML and torch give one (they differ
    when CUDA_VISIBLE_DEVICES reorders devices), else the same index."""
    torch = sys.modules.get("torch")
    try:
        uuid = str(torch.cuda.get_device_properties(cuda_index).uuid) if torch is not None else ""
    except Exception:  # no device of that index or no uuid in this torch: fall back to the index
        uuid = ""
    for index, track_uuid in enumerate(track_uuids):
        if uuid and track_uuid.removeprefix("GPU-") == uuid:
            return index
    return cuda_index


def stage_gpu_seconds(
    snap: Snapshot, cuda: dict[int, list[tuple[str, float, float, float]]], tracks: list[GpuTrack], gpu_stages: set[str]
) -> tuple[dict[str, float] | None, dict[str, str]]:
    """GPU value-seconds per stage summed over devices, and each stage's rule (`attribute_gpu`): CUDA-event
    time for stages with `cuda_span`s (`cuda`: `cuda_times`), NVML shares of `tracks` for the other GPU stages
    (`gpu_stages`; none named: every stage competes). None when neither exists."""
    if not tracks and not cuda:
        return None, {}
    busy: dict[str, list[tuple[float, float]]] = {}
    for (stage, _n, kind, t0, t1, _c0, _c1), _i in snap.spans:
        if kind == BUSY:
            busy.setdefault(stage, []).append((t0, t1))
    capable = gpu_stages or None
    timed = {stage for spans in cuda.values() for stage, *_ in spans}
    by_track: dict[int, list[tuple[str, float, float, float]]] = {}
    for device, spans in cuda.items():
        by_track.setdefault(nvml_index([t.uuid for t in tracks], device), []).extend(spans)
    out: dict[str, float] = {}
    rules: dict[str, str] = {}
    for index in sorted(set(range(len(tracks))) | set(by_track)):
        samples = list(tracks[index].util) if index < len(tracks) else []
        values, device_rules = attribute_gpu(samples, busy, by_track.get(index, []), capable=capable, timed=timed)
        for stage, value in values.items():
            out[stage] = out.get(stage, 0.0) + value
        rules |= device_rules
    return out, rules
