"""Decoding worker processes: the pool answers exactly what one in-process policy answers, loads weights
by version, drops abandoned requests, and a dead worker stops the run with its name."""

from __future__ import annotations

import os
import signal

import msgspec
import pytest
import torch
import trio

from pipeline.profiling import Profiler
from pipeline.run import build
from pipeline.run.checks import load
from pipeline.run.decoding_pool import WorkerPoolPolicy
from pipeline.run.launch import ChildExited
from stages.policy.base import AgentContext
from tests.pipeline.run.closing_backend import CLOSED_DIR

OVERRIDES = [
    "env.max_steps=8",
    "gate.k=4",
    "pretrain.enabled=false",
    "policy.max_new_tokens=8",
    "policy.options={layers = 1, d_model = 32, heads = 2, max_len = 128, max_prompt_tokens = 100}",
]


@pytest.fixture(scope="module")
def setup():
    cfg = load(None, OVERRIDES)
    suite = build.suite(cfg)
    tasks = list(suite.tasks("train"))[:6]
    contexts = []
    for task in tasks:
        env = suite.make()
        obs = env.reset(task)
        contexts.append(AgentContext(task.description, obs.text, obs.admissible, ()))
        env.close()
    return cfg, suite, contexts


async def _answers(policy, contexts, numbers):
    results = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)

        async def one(i, ctx, number):
            results[i] = await policy.act(ctx, number=number)

        async with trio.open_nursery() as calls:
            for i, (ctx, number) in enumerate(zip(contexts, numbers, strict=True)):
                calls.start_soon(one, i, ctx, number)
        nursery.cancel_scope.cancel()
    return [results[i] for i in range(len(contexts))]


@pytest.mark.slow
def test_the_pool_answers_what_one_local_policy_answers(setup):
    cfg, suite, contexts = setup
    numbers = list(range(len(contexts)))
    local = build.policy(cfg, suite, workers=1)
    pool = build.policy(cfg, suite, workers=2)
    assert isinstance(pool, WorkerPoolPolicy)
    expected = trio.run(_answers, local, contexts, numbers)
    got = trio.run(_answers, pool, contexts, numbers)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert [r.action for r in got] == [r.action for r in expected]
    assert [r.nucleus for r in got] == [r.nucleus for r in expected] and all(r.nucleus for r in got)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
        assert a.entropy is not None and a.entropy == pytest.approx(b.entropy, abs=1e-5)  # the early signal crosses too
    assert pool.statistics().answered == len(contexts)


@pytest.mark.slow
def test_weights_reach_every_worker_by_version(setup):
    cfg, suite, contexts = setup
    pool = build.policy(cfg, suite, workers=2)
    state = {k: v + 0.5 for k, v in pool.trainable().state_dict().items()}

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.serve)
            before = [await pool.act(c, greedy=True) for c in contexts[:2]]
            pool.load_weights(3, state)
            after = await _answers_live(pool, contexts * 2)
            nursery.cancel_scope.cancel()
        return before, after

    before, after = trio.run(main)
    assert {r.policy_version for r in before} == {0}
    assert {r.policy_version for r in after} == {3}  # both workers (requests spread across them)


@pytest.mark.slow
def test_weights_loaded_between_serves_are_what_the_next_serve_decodes_with(setup):
    """The off-clock curve loads each kept version while the pool is not serving (between its measures): that once
    posted into the last serve's closed inboxes (PolicyStopped: cannot reach decoding worker 0); the next serve's
    workers must decode with them."""
    cfg, suite, contexts = setup
    pool = build.policy(cfg, suite, workers=2)
    state = {k: v + 0.5 for k, v in pool.trainable().state_dict().items()}

    numbers = list(range(len(contexts)))
    first = trio.run(_answers, pool, contexts, numbers)  # one serve, ended
    pool.load_weights(5, state)  # not serving
    second = trio.run(_answers, pool, contexts, numbers)  # the next serve
    assert {r.policy_version for r in first} == {0} and {r.policy_version for r in second} == {5}


async def _answers_live(pool, contexts):
    out = []

    async def one(ctx):
        out.append(await pool.act(ctx, greedy=True))

    async with trio.open_nursery() as calls:
        for ctx in contexts:
            calls.start_soon(one, ctx)
    return out



@pytest.mark.slow
def test_the_profile_has_a_policy_row_with_the_workers_cpu(setup):
    cfg, suite, contexts = setup
    pool = build.policy(cfg, suite, workers=2)
    profiler = Profiler(gpu_sample_hz=0.0)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.serve)
            pool.attach_profiler(profiler)  # as the GRPO phase does: the workers are running already
            await _answers_live(pool, contexts * 4)
            report = profiler.finish()
            nursery.cancel_scope.cancel()
        return report

    report = trio.run(main)
    row = report.row("policy")
    assert row.items == len(contexts) * 4
    assert row.latency_from == "latency" and row.p50_ms is not None and row.p50_ms > 0
    assert 0 < row.busy_pct <= 100
    assert row.cpu_pct > 0  # the worker processes' CPU, not this process's
    assert report.process_cpu_pct is not None and report.process_cpu_pct >= row.cpu_pct

@pytest.mark.slow
def test_a_stopped_worker_closes_its_backend(setup, tmp_path, monkeypatch):
    """Stopping the pool SIGTERMs its workers; each cancels its role and closes its backend (vllm: the engine and
    its processes) before it exits, instead of dying with them still running."""
    cfg, suite, contexts = setup
    monkeypatch.setenv(CLOSED_DIR, str(tmp_path))
    cfg = msgspec.structs.replace(cfg, policy=msgspec.structs.replace(
        cfg.policy, backend="tests.pipeline.run.closing_backend:closing_backend"))
    pool = build.policy(cfg, suite, workers=2)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.serve)
            await _answers_live(pool, contexts[:2])
            nursery.cancel_scope.cancel()

    trio.run(main)
    closed = sorted(path.name for path in tmp_path.iterdir())
    assert len(closed) == 2 and f"closed-{os.getpid()}" not in closed  # the two workers', not this process's


@pytest.mark.slow
def test_a_dead_worker_stops_the_pool_with_its_name(setup):
    cfg, suite, contexts = setup
    pool = build.policy(cfg, suite, workers=2)

    async def main():
        async with trio.open_nursery() as nursery:
            await nursery.start(pool.serve)
            for pid in _worker_pids():
                os.kill(pid, signal.SIGKILL)
                break
            await trio.sleep_forever()

    with pytest.raises(BaseException) as info:  # noqa: PT011 (inside exception groups)
        trio.run(main)
    text = repr(info.value)
    assert "ChildExited" in text or isinstance(info.value, ChildExited)
    died = _find(info.value, ChildExited)
    assert died.stage == "policy" and "decoding worker" in str(died)


def _find(exc, kind):
    if isinstance(exc, kind):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        if (found := _find(inner, kind)) is not None:
            return found
    return None


def _worker_pids():
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if int(fields[1]) == me and b"pipeline.run.launch" in cmdline and b"decoder" in cmdline:
                yield int(entry)
