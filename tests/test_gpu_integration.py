"""A tiny run with the policy (2 decoding processes) and the learner on CUDA: it trains, the profile times
the learner's updates with CUDA events, and what it saves is on the CPU (a CPU machine resumes it)."""

import pytest
import torch

from pipeline.profiling import RULE_CUDA, load_report
from pipeline.run.checks import load
from pipeline.run.job import run_job
from tests.cuda import needs_cuda
from tests.test_run_integration import _tiny


@needs_cuda
@pytest.mark.slow
async def test_a_tiny_run_on_cuda_trains_and_saves_cpu_tensors(tmp_path):
    cfg = load(None, _tiny(tmp_path, "policy.device=cuda", "learner.device=cuda", "policy.workers=2", "run.name=cuda", "gate.k=4"))
    result = await run_job(cfg)
    assert result.summary["learner_updates"] == cfg.run.updates
    learner = load_report(result.run_dir).row("learner")
    assert learner.gpu_from == RULE_CUDA and learner.cuda_ms > 0
    state = torch.load(result.run_dir / "checkpoints" / "state.pt", weights_only=False)  # no map_location: as saved
    assert all(t.device.type == "cpu" for t in state["trainer"]["model"].values())
    assert all(t.device.type == "cpu" for s in state["trainer"]["optimizer"]["state"].values() for t in s.values())
    policy = torch.load(result.run_dir / "checkpoints" / "policy.pt", weights_only=True)
    assert all(t.device.type == "cpu" for t in policy.values())
