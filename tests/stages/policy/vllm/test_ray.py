"""vLLM decoders on Ray (`placement.launcher = "ray"`, docs/ray.md): each decoder actor starts its own engine
and the coordinator none (it keeps a `transformers` copy to train: `PolicyBackend.trainable`); the gate's cuts
abandon requests inside the actor's engine and no trajectory fails; the run leaves no actor, no Ray and no
engine process behind. (An untrained model's groups carry no signal, so no update is asked of it.)

Runs where both vLLM and Ray are installed (CI: .venv-vllm, built by .ci/vllm-cpu-env with the `ray` extra).
The run starts a Ray instance of its own on this machine (`placement.address = ""`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

pytest.importorskip("vllm", reason="vLLM is not installed here (CI runs these tests in .venv-vllm; docs/vllm.md)")
ray = pytest.importorskip("ray", reason="Ray is not installed here (pip install -e '.[ray]')")

from pipeline.run.checks import load  # noqa: E402
from pipeline.run.job import run_job  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.ray]

ENGINE_TITLE = "VLLM::"
"""What vLLM's engine processes call themselves (setproctitle: VLLM::EngineCore, VLLM::Worker...)."""


def _engine_processes() -> set[int]:
    """Pids of this machine's vLLM engine processes (by their process title)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path("/proc", entry, "cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
            if cmdline.startswith(ENGINE_TITLE.encode()):
                found.add(int(entry))
    return found


async def test_decoders_on_ray_run_their_own_engine_and_leave_nothing_behind(model_dir: Path, tmp_path: Path) -> None:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    already = _engine_processes()
    cfg = load(None, [
        "policy.backend=vllm", f"policy.model={json.dumps(str(model_dir))}", f"run.out={json.dumps(str(tmp_path))}",
        'placement.launcher="ray"', "policy.workers=1", "placement.ready_timeout_s=300",
        "run.updates=1", "run.max_wall_s=20", "run.progress=false", "eval.tasks=0", "env.max_steps=6",
        "rollout.group_size=4", "rollout.slots=8", "learner.batch_groups=1",
        "gate.k=2", "gate.tau=2.0",  # every group converges at K=2 by this tau: each is cut mid-rollout
    ])
    result = await run_job(cfg)
    summary = result.summary
    assert summary["decoding_workers"] == 1 and summary["env_steps"] > 0
    assert summary["groups_cut"] >= 1 and summary["cut_groups_reaching_learner"] == 0
    assert summary["trajectories_failed"] == 0
    events = (result.run_dir / "events.jsonl").read_text()
    assert events.count('"policy.workers_ready"') == 1  # placed once, for GRPO (no held-out measure to serve)
    assert '"policy.vllm.started"' not in events  # the coordinator started no engine: the actor did
    assert not ray.is_initialized()  # the run's own Ray is gone with its actors
    with trio.move_on_after(30):  # the engine's processes end with their actor's close; nothing to wait on here
        while _engine_processes() - already:  # noqa: ASYNC110
            await trio.sleep(0.2)
    assert _engine_processes() - already == set()
