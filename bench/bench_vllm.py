"""The vLLM backend, measured side by side on one engine in one run (ratios, no asserts).

    .venv-vllm/bin/python bench/bench_vllm.py [--model DIR] [--clients 64] [--rounds 4] [--cuts 24]

Needs vLLM (the `.venv-vllm` environment of docs/vllm.md). Without `--model` a small random Llama is
built first (make-model, no behaviour cloning: completions run to max_new_tokens, so both sides decode
the same number of tokens).

1. Throughput: generated tokens/s through rollcut (`--clients` Trio tasks looping on `VllmPolicy.act`)
   divided by bare `AsyncLLM.generate` on the same engine with the same prompts and sampling parameters
   (the same number of concurrent asyncio tasks on the engine's own loop). Goal >= 0.90. Rounds
   alternate, so drifting machine load hits both alike.
2. Abort latency: `--cuts` groups of 8 long requests (400 tokens, eos ignored) are started and cut
   mid-generation like the gate does (one cancel scope per group); per request, Trio cancellation ->
   `AsyncLLM.abort` returned (the ABORT is on its way to the engine core), p50 / p99.
3. Weight sync: `load_weights` of the learner's full state + wait until the engine applied it, p50 / max.

The last line is `vllm_ratio=<x>` (rollcut / bare tokens/s).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import load_config  # noqa: E402
from pipeline.run import build  # noqa: E402
from stages.policy.base import AgentContext  # noqa: E402
from stages.policy.vllm import VllmOptions, vllm_backend  # noqa: E402
from stages.policy.vllm._make_model import UNTRAINED, ModelShape, make_model  # noqa: E402
from stages.policy.vllm._server import VllmPolicy  # noqa: E402
from stages.policy.vllm._vllm_api import sampling_params  # noqa: E402


def _ms(seconds: float | None) -> float:
    """Seconds as milliseconds (NaN for a figure not measured: no abort, no sync)."""
    return float("nan") if seconds is None else seconds * 1000

def contexts(cfg: Any, n: int) -> list[AgentContext]:
    suite = build.suite(cfg)
    env, out = suite.make(), []
    for task in list(suite.tasks("train"))[:n]:
        obs = env.reset(task)
        out.append(AgentContext(task.description, obs.text, obs.admissible))
    env.close()
    return out


async def served(policy: VllmPolicy, ctxs: list[AgentContext], rounds: int) -> float:
    tokens = 0

    async def client(ctx: AgentContext) -> None:
        nonlocal tokens
        for _ in range(rounds):
            result = await policy.act(ctx)  # (not `tokens += len(await ...)`: that reads `tokens` before the await)
            tokens += len(result.token_ids)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for ctx in ctxs:
            nursery.start_soon(client, ctx)
    elapsed = time.perf_counter() - started
    print(f"  rollcut round: {tokens} tokens in {elapsed:.2f} s", flush=True)
    return tokens / elapsed


async def bare(policy: VllmPolicy, prompts: list[list[int]], rounds: int, first_number: int) -> float:
    """The same requests straight into AsyncLLM on its loop (no Trio, no parsing): the ceiling."""
    engine, stops = policy.engine, policy.prompt.stop_token_ids()
    tokens = 0

    async def client(i: int, prompt: list[int]) -> None:
        nonlocal tokens
        for r in range(rounds):
            number = first_number + r * len(prompts) + i
            params = sampling_params(policy.sampling, greedy=False, seed=None, stop_token_ids=stops)  # as VllmPolicy
            async for out in engine.generate({"prompt_token_ids": prompt}, params, f"bare-{number}"):
                final = out
            tokens += len(final.outputs[0].token_ids)

    started = time.perf_counter()
    await asyncio.gather(*(client(i, p) for i, p in enumerate(prompts)))
    elapsed = time.perf_counter() - started
    print(f"  bare round: {tokens} tokens in {elapsed:.2f} s", flush=True)
    return tokens / elapsed


async def cut_groups(policy: VllmPolicy, ctx: AgentContext, groups: int) -> None:
    def long_params(s: Any, **kwargs: Any) -> Any:
        params = sampling_params(s, **kwargs)
        params.max_tokens, params.ignore_eos, params.stop_token_ids = 400, True, []
        return params

    policy._make_params = long_params
    try:
        for _ in range(groups):
            async with trio.open_nursery() as nursery:
                with trio.CancelScope() as scope:  # one group: 8 requests under one scope, like run_group
                    for _ in range(8):
                        nursery.start_soon(policy.act, ctx)
                    await trio.sleep(0.1)  # a few decoding steps in
                    scope.cancel()
                nursery.cancel_scope.cancel()
    finally:
        policy._make_params = sampling_params


async def run(policy: VllmPolicy, ctxs: list[AgentContext], args: argparse.Namespace) -> None:
    prompts = [policy.prompt.build(c) for c in ctxs]
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        await served(policy, ctxs, 1)  # warm-up
        rates: dict[str, list[float]] = {"bare": [], "rollcut": []}
        for r in range(args.rounds):
            first = 10_000_000 * (r + 1)
            future = policy._loop.submit(bare(policy, prompts, args.requests, first))
            rates["bare"].append(await trio.to_thread.run_sync(future.result))
            rates["rollcut"].append(await served(policy, ctxs, args.requests))
        await cut_groups(policy, ctxs[0], args.cuts)
        state = policy.trainable().state_dict()
        for version in range(1, args.syncs + 1):
            policy.load_weights(policy.version + 1, {k: v + 1e-3 * version for k, v in state.items()})
            await trio.to_thread.run_sync(policy.wait_synced)
        nursery.cancel_scope.cancel()
    b, s = statistics.median(rates["bare"]), statistics.median(rates["rollcut"])
    stats = policy.statistics()
    print(f"{'bare AsyncLLM':<40}{b:>10.0f} tok/s   rounds {[round(x) for x in rates['bare']]}")
    print(f"{'rollcut VllmPolicy, ' + str(len(ctxs)) + ' Trio clients':<40}{s:>10.0f} tok/s   rounds {[round(x) for x in rates['rollcut']]}")
    print(f"{'rollcut / bare':<40}{s / b:>10.2f}   (goal >= 0.90)")
    print(f"abort latency (Trio cancel -> AsyncLLM.abort done), {stats.abandoned} requests: "
          f"p50 {_ms(stats.abort_p50_s):.2f} ms, p99 {_ms(stats.abort_p99_s):.2f} ms")
    print(f"weight sync ({stats.weight_syncs} syncs, full state): p50 {_ms(stats.weight_sync_p50_s):.1f} ms, "
          f"max {_ms(stats.weight_sync_max_s):.1f} ms")
    print(f"vllm_ratio={s / b:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model directory (default: build a small random Llama)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=4, help="requests per client per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cuts", type=int, default=24)
    parser.add_argument("--syncs", type=int, default=5)
    args = parser.parse_args()
    cfg = load_config(None, [])
    tmp = tempfile.TemporaryDirectory()
    model = args.model
    if model is None:
        model = str(Path(tmp.name) / "tiny-llama")
        make_model(Path(model), build.suite(cfg), shape=ModelShape(), bc=UNTRAINED, prompt_options=VllmOptions(), seed=0)
    cfg = load_config(None, ["policy.backend=vllm", f'policy.model="{model}"', f"policy.max_batch={args.clients}"])
    torch.set_num_threads(1)
    started = time.perf_counter()
    policy = vllm_backend(cfg.policy, cfg.pretrain, build.suite(cfg), seed=0)
    print(f"model {model}, engine started in {time.perf_counter() - started:.0f} s, {args.clients} clients x "
          f"{args.requests} requests x {args.rounds} rounds, max_new_tokens {cfg.policy.max_new_tokens}")
    try:
        trio.run(run, policy, contexts(cfg, args.clients), args)
    finally:
        policy.close()
        tmp.cleanup()


if __name__ == "__main__":
    main()
