"""Checkpoints a run can be resumed from, written atomically; what a resume may and may not change.

`checkpoints/state.pt` holds everything a stopped run needs to go on as if it had not stopped, taken at
a learner-update boundary (the learner thread is idle then, so weights, optimizer and counters agree):

    version           learner version (updates done)
    trainer           model weights, optimizer state, the trainer's item-sampling rng
    policy            the backend's own sampling state, if it has one (`sampling_state()`)
    allocator         `allocator.state_dict()` (groups in flight count as lost, see docs/allocators.md)
    grpo              counters of the phase (`PhaseCounters`), admission ids, env steps, learner version, gate counters,
                      loop-lag histogram, GRPO wall time so far, the ledger of work by fate (`pipeline/ledger.py`)
    rng               Python's and torch's global generators
    job               what the job measured before GRPO (warm start time, held-out success before)

Loading a checkpoint runs no code, whoever wrote the run folder (a shared runs directory, a copied folder): the
file is the state packed by `pipeline.tensors` (msgpack; tensors as dtype, shape and raw bytes; tuples kept),
the form in which trainer state crosses a socket, which rebuilds that tree and nothing else: no pickle, no
class looked up by name. A file that is not such a checkpoint (a planted pickle, a truncated or damaged file)
is `RunRefused`: one line naming the file (exit 2).

Every file is written to a temporary name and renamed (`atomic_write`): a crash or a full disk mid-write
leaves the previous checkpoint intact. Groups in flight at the checkpoint are not saved: a resumed run
starts new groups (with new ids) in their place.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import msgspec
import torch
import trio

from learner.trainer import published_weights
from pipeline import tensors
from pipeline.config import RunConfig

from .failure import RunRefused

FORMAT = 2
"""2: the state packed by `pipeline.tensors` (msgpack, no pickle); 1 (before): the whole state pickled."""
STATE_FILE = "state.pt"


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write `path` through a temporary sibling and rename it into place (never half a file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


class Checkpointer:
    """Holds the latest update-boundary state in memory and writes it every `every` updates (and on demand:
    Ctrl-C, the end of GRPO, a failure)."""

    def __init__(self, run_dir: Path, every: int, job: Mapping[str, Any] | None = None, *, keep_weights_every: int = 0) -> None:
        self.path = run_dir / "checkpoints" / STATE_FILE
        self.every = every
        self.keep_weights_every = keep_weights_every
        """Also keep the policy's weights every this many updates (`run.keep_weights_every`: `weights_path`)."""
        self.job: dict[str, Any] = dict(job or {})
        """Job-level figures measured before GRPO, stored with every checkpoint."""
        self.latest: dict[str, Any] | None = None
        self.written_version: int | None = None

    def capture(self, state: dict[str, Any]) -> None:
        self.latest = state | {"format": FORMAT, "job": self.job}

    async def after_update(self, version: int) -> None:
        if self.every and version % self.every == 0:
            await trio.to_thread.run_sync(self.write)
        if self.keep_weights_every and version % self.keep_weights_every == 0:
            await trio.to_thread.run_sync(self.keep_weights)

    def weights_path(self, version: int) -> Path:
        return self.path.with_name(f"policy-v{version:04d}.pt")

    def keep_weights(self) -> Path | None:
        """The published weights of the latest captured update as `checkpoints/policy-v<N>.pt` (tensors only:
        what `bench/calibrate_gate.py --weights` rolls out); None when nothing was captured."""
        state = self.latest
        if state is None:
            return None
        path = self.weights_path(state["version"])
        atomic_write(path, lambda f: torch.save(published_weights(state["trainer"]), f))
        return path

    def keep_due(self) -> Path | None:
        """The latest captured update's weights when they are due (`keep_weights_every`) and not kept yet: Ctrl-C
        can stop the phase between an update's capture and its `after_update`, and a resume starts after that
        update, so nothing else would keep them. None: nothing to keep."""
        state = self.latest
        if state is None or not self.keep_weights_every or state["version"] % self.keep_weights_every:
            return None
        return None if self.weights_path(state["version"]).exists() else self.keep_weights()

    def write(self) -> int | None:
        """Write the latest captured state if not written yet; returns its version (None: nothing)."""
        state = self.latest
        if state is None:
            return None
        if state["version"] != self.written_version:
            atomic_write(self.path, lambda f: f.write(tensors.pack(state)))
            self.written_version = state["version"]
        return state["version"]


def load_state(run_dir: Path) -> dict[str, Any] | None:
    """The run folder's checkpoint, or None when the run stopped before its first update; `RunRefused` (one line
    naming the file) when the file is not a checkpoint this rollcut wrote: nothing in it is run."""
    path = run_dir / "checkpoints" / STATE_FILE
    if not path.exists():
        return None
    try:
        state = tensors.unpack(path.read_bytes())
    except tensors.WireError as exc:
        raise RunRefused(f"{path} cannot be read as a checkpoint ({_first_line(exc)}): it is damaged, or not one this "
                         "rollcut wrote (nothing in it was run); start a new run, or restore the file") from exc
    except OSError as exc:
        raise RunRefused(f"{path} cannot be read: {exc.strerror or exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise RunRefused(f"{path}: checkpoint format {found!r}, this rollcut reads {FORMAT} (start a new run)")
    return state


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].rstrip(".") if text else ""


def trim_metrics(run_dir: Path, version: int) -> int:
    """Drop metrics.jsonl rows of updates after the checkpoint (they will be trained again); returns how
    many were dropped. The file is only rewritten when there is something to drop."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = []
    for line in lines:
        try:
            iteration = json.loads(line).get("iteration", 0)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if iteration <= version:
            kept.append(line)
    if len(kept) != len(lines):
        atomic_write_text(path, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


# --------------------------------------------------------------------------------------------------
# Global RNGs


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


# --------------------------------------------------------------------------------------------------
# Counters of the GRPO phase (duck-typed: this module does not import the stages)


def _fields(obj: Any, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {
        f.name: getattr(obj, f.name)
        for f in dataclasses.fields(obj)
        if f.name not in skip and isinstance(getattr(obj, f.name), int | float)
    }


_WINDOW = frozenset({"window_rollouts", "window_successes", "window_steps_at", "window_started", "resumed_wall_s", "resumed_dropped_frames"})
_ROLLOUT = ("env_steps", "trajectories_failed", "trajectories_ended", "trajectory_seconds", "cuts_late", "first_error",
            "cancels_received", "shadow_cancels")


def capture_counters(*, counters: Any, admission: Any, rollout: Any, version: int, gate: Any, wall_s: float) -> dict[str, Any]:
    """Every counter the summary adds up, as plain data (copied: later updates do not change it)."""
    return copy.deepcopy({
        "tally": _fields(counters, _WINDOW),
        "loop_lag": counters.loop_lag.state_dict(),
        "loop_blocks": counters.loop_blocks,
        "kinds_by_family": counters.kinds_by_family,
        "admission": admission.state_dict(),
        "rollout": {k: getattr(rollout, k) for k in _ROLLOUT},
        "learner": {"version": version},
        "gate": None if gate is None else gate.counters_state(),
        "wall_s": wall_s,
    })


def add_counts(a: Mapping[str, Mapping[str, int]], b: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Two nested {name: {reason: count}} tables added key by key."""
    out = {name: dict(counts) for name, counts in a.items()}
    for name, counts in b.items():
        mine = out.setdefault(name, {})
        for reason, n in counts.items():
            mine[reason] = mine.get(reason, 0) + n
    return out


def restore_counters(state: Mapping[str, Any], *, counters: Any, admission: Any, rollout: Any, gate: Any) -> int:
    """Put a checkpoint's counters back; returns the learner version it was taken at."""
    for key, value in state["tally"].items():
        setattr(counters, key, value)
    for key, value in state["learner"].get("counters", {}).items():  # checkpoints before one set of counters
        if key != "groups_received" or "groups_received" not in state["tally"]:
            setattr(counters, key, value)
    counters.loop_lag.load_state_dict(state["loop_lag"])
    counters.loop_blocks = copy.deepcopy(state.get("loop_blocks", {}))  # absent in older checkpoints
    counters.kinds_by_family = copy.deepcopy(state.get("kinds_by_family", {}))  # absent in older checkpoints
    counters.resumed_wall_s = state["wall_s"]
    counters.resumed_dropped_frames = state.get("dropped_frames", {})
    admission.load_state_dict(state["admission"])
    for key in _ROLLOUT:
        setattr(rollout, key, state["rollout"].get(key, getattr(rollout, key)))
    counters.window_steps_at = rollout.env_steps
    if "ledger" in state:
        counters.ledger.load_state_dict(state["ledger"])
    elif rollout.env_steps:  # a checkpoint from before the ledger: its env steps have no fate
        counters.ledger.predates(rollout.env_steps)
    if gate is not None and state["gate"] is not None:
        gate.load_counters(state["gate"])
    return state["learner"]["version"]


# --------------------------------------------------------------------------------------------------
# What a resume may change

IGNORED = ("run.name", "run.out")
"""The folder being resumed decides these."""
HARMLESS = (
    "run.updates", "run.max_wall_s", "run.progress", "run.torch_threads", "run.checkpoint_every", "run.keep_weights_every",
    "run.flat_memory", "run.malloc_arenas",
    "run.target_heldout", "policy.workers", "run.trackers", "trackers.", "policy.device", "learner.device",
    "learner.torch_threads", "policy.max_batch", "policy.max_wait_ms", "policy.cache_dir", "policy.options.threads",
    "profile.", "transport.", "placement.", "eval.",
)
"""Change how long or how observably the run goes on, not what it learns (a backend's `threads` option: its torch
threads for decoding). Read before BLOCKING, whose `policy.options` it narrows."""
BLOCKING = (
    "env.name", "env.options", "env.train_tasks", "policy.backend", "policy.options", "allocator.",
    "rollout.group_size", "learner.batch_groups", "pretrain.",
)
"""The checkpoint cannot be used with another value (model shape, task set, allocator state)."""
PER_OPTION = ("policy.options", "env.options")
"""Option tables compared key by key (`policy.options.threads`), not as one value."""


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and (data and prefix.count(".") < 2 or prefix[:-1] in PER_OPTION):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out |= _flat(value, f"{prefix}{key}.")
        return out
    return {prefix[:-1]: data}


def config_changes(saved: RunConfig, new: RunConfig) -> tuple[list[str], list[str], list[str]]:
    """(blocking, training, harmless) differences between the folder's config and the resumed one, each
    as `key: old -> new`."""
    old_flat, new_flat = _flat(msgspec.to_builtins(saved)), _flat(msgspec.to_builtins(new))
    blocking: list[str] = []
    training: list[str] = []
    harmless: list[str] = []
    for key in sorted(old_flat.keys() | new_flat.keys()):
        before, after = old_flat.get(key), new_flat.get(key)
        if before == after or key in IGNORED:
            continue
        line = f"{key}: {before!r} -> {after!r}"
        if key.startswith(HARMLESS):
            harmless.append(line)
        elif key.startswith(BLOCKING):
            blocking.append(line)
        else:
            training.append(line)
    return blocking, training, harmless
