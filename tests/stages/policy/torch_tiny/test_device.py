"""The embedded policy on CUDA (`policy.device`): it decodes what the CPU decodes, serves weights published
from the CPU, and its warm start trains there and caches CPU tensors any device loads."""

from __future__ import annotations

import copy

import torch

from pipeline.config import PolicySection
from pipeline.profiling import RULE_CUDA, Profiler
from stages.policy.torch_tiny import generate, torch_tiny_backend
from stages.policy.torch_tiny._server import request_uniforms
from tests.cuda import needs_cuda
from tests.stages.policy.fake_suite import FindSuite

from .conftest import make_policy
from .test_build import PRETRAIN, _cfg
from .test_server import CONTEXTS, act_in_order, serving

PROMPTS = [[1, 5, 11, 12, 13, 7], [1, 5, 14, 7], [1, 5, 15, 16, 17, 18, 19, 7]] * 4


def _generate(model, **kwargs):
    uniforms = torch.stack([request_uniforms(0, i, 6) for i in range(len(PROMPTS))])
    return generate(model, PROMPTS, uniforms=uniforms, greedy=[i % 2 == 0 for i in range(len(PROMPTS))], max_new_tokens=6,
                    temperature=0.7, top_p=0.95, stop_ids=(2, 4), **kwargs)


@needs_cuda
def test_cuda_decoding_matches_the_cpu_free_and_constrained(model) -> None:
    on_cuda = copy.deepcopy(model).to("cuda")
    choices = [[[9, 10, 2], [9, 11, 12, 2], [13, 2]], [[9, 10, 2]], []] * 4
    for kwargs in ({}, {"choices": choices}):
        for by in ("token", "command"):
            model.choose_by = on_cuda.choose_by = by
            cpu, gpu = _generate(model, **kwargs), _generate(on_cuda, **kwargs)
            assert [s.token_ids for s in gpu] == [s.token_ids for s in cpu]
            for a, b in zip(gpu, cpu, strict=True):
                torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


@needs_cuda
async def test_a_cuda_policy_serves_weights_published_from_the_cpu_and_times_its_batches(model, fmt) -> None:
    policy = make_policy(copy.deepcopy(model).to("cuda"), fmt, max_batch=8)
    profiler = Profiler(gpu_sample_hz=0.0)
    policy.attach_profiler(profiler)
    reference = make_policy(model, fmt, max_batch=8)
    async with serving(policy), serving(reference):
        weights = {k: v + 0.01 for k, v in model.state_dict().items()}  # a learner's CPU copy
        policy.load_weights(1, weights)
        reference.load_weights(1, weights)
        got = await act_in_order(policy, CONTEXTS)
        want = await act_in_order(reference, CONTEXTS)
    assert [r.policy_version for r in got] == [1] * len(CONTEXTS)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    assert next(policy.trainable().parameters()).device.type == "cuda"
    row = profiler.finish().row("policy")
    assert row.gpu_from == RULE_CUDA and row.cuda_ms > 0


@needs_cuda
def test_the_warm_start_trains_on_cuda_and_caches_cpu_tensors(tmp_path) -> None:
    cuda_cfg = PolicySection(max_new_tokens=8, cache_dir=str(tmp_path), device="cuda", options=_cfg(tmp_path).options)
    on_cuda = torch_tiny_backend(cuda_cfg, PRETRAIN, FindSuite(), seed=0)
    assert next(on_cuda.model.parameters()).device.type == "cuda"
    [cached] = tmp_path.glob("torch_tiny-find-*.pt")
    saved = torch.load(cached, weights_only=True)
    assert all(t.device.type == "cpu" for t in saved["state"].values())
    cpu_cfg = PolicySection(max_new_tokens=8, cache_dir=str(tmp_path), device="cpu", options=_cfg(tmp_path).options)
    on_cpu = torch_tiny_backend(cpu_cfg, PRETRAIN, FindSuite(), seed=0)
    assert len(list(tmp_path.glob("torch_tiny-find-*.pt"))) == 1  # the same cache, whatever the device
    for key, value in on_cpu.model.state_dict().items():
        torch.testing.assert_close(value, on_cuda.model.state_dict()[key].cpu(), rtol=0, atol=0)
