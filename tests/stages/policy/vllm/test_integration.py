"""The vLLM backend for real: AsyncLLM on vllm-cpu with a small local Llama (built by make-model).

Runs only where vLLM is installed (CI builds `.venv-vllm` and runs `pytest -m vllm` there; see .ci/run
and docs/vllm.md); everywhere else the whole module is skipped with that reason. The engine starts once
per module (about a minute on 2 idle cores), the pipeline test starts its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import trio

pytest.importorskip("vllm", reason="vLLM is not installed here (CI runs these tests in .venv-vllm; docs/vllm.md)")

from pipeline.config import load_config  # noqa: E402
from pipeline.profiling import load_report  # noqa: E402
from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from pipeline.run.job import run_job  # noqa: E402
from stages.policy.base import AgentContext  # noqa: E402
from stages.policy.vllm import vllm_backend  # noqa: E402
from stages.policy.vllm._learner import CausalLMTrainable  # noqa: E402
from stages.policy.vllm._server import VllmPolicy  # noqa: E402
from stages.policy.vllm._vllm_api import sampling_params  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CTX = AgentContext("put a clean mug in cabinet 1", "You are in the kitchen. You see a mug 1.", ("take mug 1", "look"))


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> Iterator[VllmPolicy]:
    cfg = load_config(None, ["policy.backend=vllm", f"policy.model={json.dumps(str(model_dir))}"])
    built = vllm_backend(cfg.policy, cfg.pretrain, build.suite(cfg), seed=0)
    yield built
    built.close()


async def test_generate_returns_ids_and_the_learners_logprobs(policy: VllmPolicy) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        results = [await policy.act(CTX) for _ in range(3)]
        nursery.cancel_scope.cancel()
    for r in results:
        assert r.token_ids and len(r.logprobs) == len(r.token_ids) and r.policy_version == policy.version
        assert len(r.token_ids) <= policy.sampling.max_new_tokens
    learner = policy.trainable()
    new, mask, _ = learner.completion_logprobs([r.prompt_ids for r in results], [r.token_ids for r in results])
    for i, r in enumerate(results):
        ratio = torch.exp(new[i, : len(r.token_ids)] - torch.tensor(r.logprobs))
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-3), ratio  # same weights -> ratio 1


async def test_a_turns_logprob_does_not_depend_on_its_batch(policy: VllmPolicy) -> None:
    """Issue 60: the fixture's config says top_p = 0.95, but the engine records no nucleus, so the backend samples
    without one (top-p 1): each turn's log-prob is the same scored alone or in a batch, and the ratio to what the
    engine recorded is 1 at unchanged weights (no token can fall on the other side of a recomputed boundary)."""
    assert policy.sampling.top_p == 1.0
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        results = [await policy.act(CTX) for _ in range(4)]
        nursery.cancel_scope.cancel()
    learner = policy.trainable()
    batched, _, _ = learner.completion_logprobs([r.prompt_ids for r in results], [r.token_ids for r in results])
    for i, r in enumerate(results):
        alone, _, _ = learner.completion_logprobs([r.prompt_ids], [r.token_ids])
        n = len(r.token_ids)
        assert torch.allclose(alone[0, :n], batched[i, :n], atol=1e-5), (alone[0, :n], batched[i, :n])
        ratio = torch.exp(alone[0, :n] - torch.tensor(r.logprobs))
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-3), ratio


async def test_abort_mid_generation_frees_the_request(policy: VllmPolicy, monkeypatch: pytest.MonkeyPatch) -> None:
    def long_params(s, **kwargs):  # noqa: ANN001, ANN003, ANN202
        params = sampling_params(s, **kwargs)
        params.max_tokens, params.ignore_eos, params.stop_token_ids = 400, True, []
        return params

    monkeypatch.setattr(policy, "_make_params", long_params)
    engine = policy.engine
    before = policy.statistics().abandoned
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_once_generating, engine, scope)
            await policy.act(CTX)
        assert scope.cancelled_caught
        # The engine core has dropped it (no waiting or running request: its KV blocks are free).
        # Another process's state: nothing to wait on but polling (the test's own timeout bounds it).
        while engine.output_processor.get_num_unfinished_requests() or await _engine_has_work(policy):  # noqa: ASYNC110
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    stats = policy.statistics()
    assert stats.abandoned == before + 1 and stats.abort_p50_s is not None


async def test_weight_update_changes_outputs_and_bumps_the_version(policy: VllmPolicy) -> None:
    learner = policy.trainable()
    torch.manual_seed(1)
    with torch.no_grad():  # parameters(), not state_dict(): tied embeddings get one perturbation
        for p in learner.parameters():
            p.add_(0.5 * torch.randn_like(p))
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        old = await policy.act(CTX, greedy=True)
        version = policy.version + 1
        policy.load_weights(version, learner.state_dict())
        assert await trio.to_thread.run_sync(policy.wait_synced) == version
        new = await policy.act(CTX, greedy=True)
        nursery.cancel_scope.cancel()
    assert new.policy_version == version and old.policy_version == version - 1
    assert new.token_ids != old.token_ids or new.logprobs != pytest.approx(old.logprobs, abs=1e-3)
    # The learner's copy starts from the synced weights; greedy results are scored at temperature 1.
    synced = CausalLMTrainable(policy.trainable().lm, temperature=0.0, top_p=1.0)
    logp, _, _ = synced.completion_logprobs([new.prompt_ids], [new.token_ids])
    assert logp[0, : len(new.token_ids)].tolist() == pytest.approx(new.logprobs, abs=1e-3)


@pytest.fixture(scope="module")
def lora_policy(model_dir: Path) -> Iterator[VllmPolicy]:
    pytest.importorskip("peft", reason="LoRA needs peft (the lora extra; .ci/vllm-cpu installs it)")
    cfg = load_config(None, [
        "policy.backend=vllm", f"policy.model={json.dumps(str(model_dir))}",
        "policy.options.lora_rank=8", "policy.options.lora_alpha=16",
    ])
    built = vllm_backend(cfg.policy, cfg.pretrain, build.suite(cfg), seed=0)
    yield built
    built.close()


async def test_lora_update_changes_outputs_and_bumps_the_version(lora_policy: VllmPolicy) -> None:
    policy = lora_policy
    learner = policy.trainable()
    names = [n for n, p in learner.lm.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)  # the learner trains the adapter only
    torch.manual_seed(2)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(0.5 * torch.randn_like(p))  # B leaves 0: the adapter now changes the model
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        old = await policy.act(CTX, greedy=True)
        version = policy.version + 1
        policy.load_weights(version, learner.state_dict())
        assert await trio.to_thread.run_sync(policy.wait_synced) == version
        new = await policy.act(CTX, greedy=True)
        sampled = await policy.act(CTX)
        nursery.cancel_scope.cancel()
    assert (old.policy_version, new.policy_version, sampled.policy_version) == (version - 1, version, version)
    assert new.token_ids != old.token_ids or new.logprobs != pytest.approx(old.logprobs, abs=1e-3)
    # vLLM's LoRA kernels and peft compute the same model: the engine's log-probs are the learner's.
    greedy = CausalLMTrainable(policy.trainable().lm, temperature=0.0, top_p=1.0, lora=policy.lora)
    logp = greedy.completion_logprobs([new.prompt_ids], [new.token_ids]).logprobs
    assert logp[0, : len(new.token_ids)].tolist() == pytest.approx(new.logprobs, abs=1e-3)
    ratio = torch.exp(policy.trainable().completion_logprobs([sampled.prompt_ids], [sampled.token_ids]).logprobs[0]
                      - torch.tensor(sampled.logprobs))
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-3), ratio


async def test_pipeline_runs_and_the_gate_cut_aborts_engine_requests(model_dir: Path, tmp_path: Path) -> None:
    cfg = load(None, [
        "policy.backend=vllm", f"policy.model={json.dumps(str(model_dir))}", f"run.out={json.dumps(str(tmp_path))}",
        "run.updates=1", "run.max_wall_s=20", "run.progress=false", "eval.tasks=0", "env.max_steps=6",
        "rollout.group_size=4", "rollout.slots=8", "learner.batch_groups=1",
        "gate.k=2", "gate.tau=2.0",  # every group converges at K=2 by this tau: each is cut mid-rollout
    ])
    result = await run_job(cfg)
    summary = result.summary
    assert summary["groups_cut"] >= 1 and summary["cut_groups_reaching_learner"] == 0
    assert summary["trajectories_failed"] == 0
    engine_row = load_report(result.run_dir).row("vllm")  # the engine is its own profile stage
    assert engine_row.busy_pct is not None and engine_row.busy_pct > 0 and engine_row.cpu_pct > 0


async def _cancel_once_generating(engine, scope: trio.CancelScope) -> None:  # noqa: ANN001
    while engine.output_processor.get_num_unfinished_requests() == 0:  # noqa: ASYNC110 (the engine's state)
        await trio.sleep(0.005)
    await trio.sleep(0.05)  # a few decoding steps in: the request is mid-generation (400 tokens to go)
    scope.cancel()


async def _engine_has_work(policy: VllmPolicy) -> bool:
    """EngineCore.has_work() (waiting or running requests), asked over vLLM's utility channel."""
    future = policy._loop.submit(policy.engine.engine_core.call_utility_async("has_work"))
    return bool(await trio.to_thread.run_sync(future.result))


def _engine_descendants(pid: int) -> list[int]:
    """vLLM engine processes (setproctitle `VLLM::...`) below `pid`."""
    from pipeline.run.teardown import descendants

    found = []
    for child in descendants(pid):
        try:
            if Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"VLLM::"):
                found.append(child)
        except OSError:
            continue
    return found


@pytest.mark.parametrize(("command", "interrupts"), [([], 1), ([], 2), (["pretrain"], 1)],
                         ids=["run.py", "run.py, Ctrl-C twice", "run.py pretrain"])
def test_ctrl_c_while_the_engine_starts_leaves_no_vllm_process(model_dir: Path, tmp_path: Path, command, interrupts) -> None:
    """Issue 60: Ctrl-C as soon as the engine's processes exist (the engine still starting), once or twice, in
    `run.py` and `run.py pretrain`: no `VLLM::` process is left (closed once started, or killed)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[4]
    sets = ["policy.backend=vllm", f"policy.model={json.dumps(str(model_dir))}", f"run.out={json.dumps(str(tmp_path))}",
            "run.updates=1", "run.progress=false", "eval.tasks=0"]
    # The vLLM config: run.py's default (configs/default.toml) sets torch_tiny's options, which the vllm backend
    # refuses (exit 2 before any engine starts).
    proc = subprocess.Popen([sys.executable, "run.py", *command, "--config", "configs/vllm-cpu.toml",
                             *[a for s in sets for a in ("--set", s)]], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": str(root)})
    engines: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while not engines and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # another process: no event to wait on
            engines = _engine_descendants(proc.pid)
        if not engines:
            proc.kill()
            _, err = proc.communicate(timeout=60)
            pytest.fail(f"no engine process appeared (exit {proc.returncode}):\n{err[-4000:]}")
        for _ in range(interrupts):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    deadline = time.monotonic() + 30
    while _alive(engines) and time.monotonic() < deadline:
        time.sleep(0.2)  # other processes: no event to wait on
    assert _alive(engines) == [], err


def _alive(pids: list[int]) -> list[int]:
    """Those of `pids` still running (not gone, not zombies)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(pid)
    return out
