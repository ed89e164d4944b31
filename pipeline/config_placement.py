"""`[placement]`: where the run's processes are started — on this machine (`local`) or as Ray actors.

With `launcher = "ray"` the run (this process: the coordinator) connects to a Ray cluster and each decoding
worker (`policy.workers` of them) is an actor placed by Ray with the resources of `[placement.decoder]`, spread
over the nodes by `decoder_strategy`; with `transport.mode = "processes"` too, the gate and learner stages are
actors as well, packed together with the resources of `[placement.stages]` each (threads mode keeps them in
the coordinator). With `[placement.coordinator]` set, the coordinator itself is an actor too (the process you
started only waits on it). See docs/ray.md.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .config_sections import _failed, _Section

LAUNCHERS = ("local", "ray")
STRATEGIES = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")


class RoleResources(_Section):
    """What Ray reserves for one actor of a role (`ray.remote` options)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = {}
    """Custom node resources, e.g. `{decoder_node = 1}` to keep decoders on the nodes started with it."""

    def problems(self, where: str = "placement") -> list[str]:
        return _failed(
            (self.num_cpus >= 0, f"{where}.num_cpus must be >= 0"),
            (self.num_gpus >= 0, f"{where}.num_gpus must be >= 0"),
            *((amount > 0, f"{where}.resources.{name} must be > 0") for name, amount in self.resources.items()),
            (self.num_cpus > 0 or self.num_gpus > 0 or bool(self.resources),
             f"{where} reserves nothing (num_cpus = num_gpus = 0, no resources): Ray needs one resource to place it"),
        )

    def options(self) -> dict[str, Any]:
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": dict(self.resources)}


class PlacementSection(_Section):
    launcher: str = "local"
    """`local`: child processes of this one (`pipeline/run/launch.py`). `ray`: decoding workers are Ray actors
    (`pipeline/run/ray_launch.py`; `pip install -e .[ray]`)."""
    address: str = ""
    """The Ray cluster to join: "" starts a Ray instance on this machine for the run, "auto" joins the one
    `ray start` made here, `HOST:PORT` (or `ray://...`) a remote head."""
    decoder: RoleResources = RoleResources()
    stages: RoleResources = RoleResources()
    """The gate and learner actors (`transport.mode = "processes"`), each: e.g. `resources = {head = 1}` for the
    head node, `num_gpus = 1` for a learner on a GPU node (`learner.device`)."""
    coordinator: RoleResources | None = None
    """The coordinator as a Ray actor of its own with these resources, e.g. `{num_cpus = 1, resources = {head = 1}}`
    (`pipeline/run/ray_coordinator.py`); unset: the coordinator is the process you started."""
    decoder_strategy: str = "SPREAD"
    """The decoders' placement group strategy: SPREAD over the nodes (the default), PACK, STRICT_SPREAD, STRICT_PACK."""
    listen: str = ""
    """The host the run's tcp sockets bind on ("": the advertised one; "0.0.0.0" for every interface)."""
    advertise: str = ""
    """The host the decoders are told to connect to ("": this node's IP as Ray sees it). Set it where a
    node has several network interfaces."""
    ready_timeout_s: float = 120.0
    """How long the run waits for Ray to reserve every decoder's resources before it fails, naming them."""
    namespace: str = "rollcut"
    """The Ray namespace of the run's actors (named `rollcut-decoder-<run>-<i>`)."""

    def problems(self) -> list[str]:
        problems = _failed(
            (self.launcher in LAUNCHERS, f"placement.launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}"),
            (self.decoder_strategy in STRATEGIES,
             f"placement.decoder_strategy must be one of {', '.join(STRATEGIES)}, got {self.decoder_strategy!r}"),
            (self.ready_timeout_s > 0, "placement.ready_timeout_s must be > 0"),
        ) + self.decoder.problems("placement.decoder") + self.stages.problems("placement.stages")
        if self.coordinator is not None:
            problems += self.coordinator.problems("placement.coordinator")
            if self.launcher != "ray":
                problems.append("placement.coordinator places the coordinator on Ray: it needs placement.launcher = \"ray\"")
        if self.launcher == "ray" and importlib.util.find_spec("ray") is None:
            problems.append("placement.launcher = \"ray\" needs Ray: pip install -e '.[ray]'")
        return problems
