"""Policy throughput, measured side by side in one run (ratios, no asserts).

    .venv/bin/python bench/bench_policy.py [--batch 64] [--rounds 6] [--suite household] [--threads 1]

1. Server efficiency: generated tokens/s of `TorchTinyPolicy` serving `--batch` concurrent Trio tasks
   (each looping on `act()`) divided by a bare loop calling the batched KV-cache `generate` on the same
   prompts with the same model and thread count. Goal >= 0.85.
2. KV cache: tokens/s of cached decoding divided by full recomputation each step, at B=8 and `--batch`.

The model has the default size and random weights (its completions run to `max_new_tokens`, so every
configuration decodes the same number of tokens); prompts are built by the policy's own prompt format
from the suite's first observations, so their lengths are realistic.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.envs import ENVS  # noqa: E402
from stages.policy.base import AgentContext  # noqa: E402
from stages.policy.torch_tiny import (  # noqa: E402
    ModelConfig,
    PromptFormat,
    SamplingConfig,
    TinyLM,
    TorchTinyPolicy,
    WordTokenizer,
    generate,
)
from stages.policy.torch_tiny._generate import generate_uncached  # noqa: E402
from stages.policy.torch_tiny._server import request_uniforms  # noqa: E402


def contexts_for(suite_name: str, n: int) -> tuple[WordTokenizer, list[AgentContext]]:
    suite = ENVS.get(suite_name)(max_steps=30)
    tokenizer = WordTokenizer.from_vocabulary(suite.vocabulary())
    env = suite.make()
    contexts = []
    for task in list(suite.tasks("train"))[:n]:
        obs = env.reset(task)
        plan = suite.expert(task)
        step = env.step(plan[0])  # one step in, so the prompt has a history pair
        contexts.append(
            AgentContext(
                task.description, step.observation.text, step.observation.admissible, ((obs.text, plan[0]),)
            )
        )
    return tokenizer, contexts


def bare_loop(
    model: TinyLM, prompts: list[list[int]], sampling: SamplingConfig, rounds: int, stop_ids: tuple[int, ...]
) -> float:
    """Generated tokens/s of back-to-back batched `generate` calls (same sampling and stops as the server)."""
    tokens, started = 0, time.perf_counter()
    for r in range(rounds):
        uniforms = torch.stack(
            [request_uniforms(0, r * len(prompts) + i, sampling.max_new_tokens) for i in range(len(prompts))]
        )
        samples = generate(
            model,
            prompts,
            uniforms=uniforms,
            greedy=[False] * len(prompts),
            max_new_tokens=sampling.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            stop_ids=stop_ids,
        )
        tokens += sum(len(s.token_ids) for s in samples)
    return tokens / (time.perf_counter() - started)


def in_thread(fn, *args, threads: int = 1):  # noqa: ANN001, ANN002, ANN201
    """Run `fn(*args)` in a fresh thread with `threads` torch threads, like the server's decoding worker.

    (torch decoding measured ~20 % faster in a non-main thread than in the main one on this machine,
    so the bare loop runs in a thread too for a like-for-like ratio.)
    """
    out = []

    def target() -> None:
        torch.set_num_threads(threads)
        out.append(fn(*args))

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    return out[0]


def served(
    model: TinyLM, fmt: PromptFormat, contexts: list[AgentContext], sampling: SamplingConfig, rounds: int
) -> float:
    """Generated tokens/s of the policy server with one looping Trio task per context."""
    policy = TorchTinyPolicy(model, fmt, sampling, seed=0)
    tokens = 0

    async def client(ctx: AgentContext) -> None:
        nonlocal tokens
        for _ in range(rounds):
            result = await policy.act(ctx)  # not `tokens += len(await ...)`: that reads tokens first
            tokens += len(result.token_ids)

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            await nursery.start(policy.serve)
            started = time.perf_counter()
            async with trio.open_nursery() as clients:
                for ctx in contexts:
                    clients.start_soon(client, ctx)
            elapsed = time.perf_counter() - started
            nursery.cancel_scope.cancel()
        return tokens / elapsed

    return trio.run(main)


def kv_speedup(model: TinyLM, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    kw = dict(
        greedy=[False] * len(prompts), max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, stop_ids=()
    )
    uniforms = torch.rand(len(prompts), new_tokens)
    times = []
    for fn in (generate, generate_uncached):
        started = time.perf_counter()
        fn(model, prompts, uniforms=uniforms, **kw)
        times.append(time.perf_counter() - started)
    tokens = len(prompts) * new_tokens
    return tokens / times[0], tokens / times[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=64, help="concurrent requests (= max_batch)")
    parser.add_argument("--rounds", type=int, default=6, help="act() calls per concurrent task")
    parser.add_argument("--suite", default="household")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the decoding thread (policy.options.threads)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    tokenizer, contexts = contexts_for(args.suite, args.batch)
    fmt = PromptFormat(tokenizer, history=8, max_obs_tokens=64, max_prompt_tokens=200)
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(vocab_size=len(tokenizer), pad_id=tokenizer.pad_id)).eval()
    sampling = SamplingConfig(max_new_tokens=12, max_batch=args.batch, max_wait_ms=2.0, threads=args.threads)
    prompts = [fmt.build(c) for c in contexts]
    mean_len = sum(map(len, prompts)) / len(prompts)
    print(
        f"model {model.num_parameters() / 1e6:.2f} M params, {len(prompts)} prompts of {mean_len:.0f} tokens "
        f"(mean), {sampling.max_new_tokens} new tokens, torch threads {args.threads}"
    )

    stops = (tokenizer.eos_id, tokenizer.nl_id)
    in_thread(bare_loop, model, prompts, sampling, 1, stops, threads=args.threads)  # warm-up
    bare, server = [], []
    for _ in range(2):  # alternate, so drifting machine load hits both alike
        bare.append(in_thread(bare_loop, model, prompts, sampling, args.rounds, stops, threads=args.threads))
        server.append(served(model, fmt, contexts, sampling, args.rounds))
    b, s = sum(bare) / len(bare), sum(server) / len(server)
    print(f"{'bare batched KV loop':<34}{b:>10.0f} tok/s")
    print(f"{'policy server, ' + str(args.batch) + ' Trio clients':<34}{s:>10.0f} tok/s")
    print(f"{'server / bare':<34}{s / b:>10.2f}   (goal >= 0.85)")

    for batch in sorted({8, args.batch}):
        cached, full = in_thread(kv_speedup, model, prompts[:batch], sampling.max_new_tokens, threads=args.threads)
        print(
            f"KV cache B={batch:<3} {cached:>8.0f} tok/s vs recompute {full:>7.0f} tok/s   x{cached / full:.1f}"
        )


if __name__ == "__main__":
    main()
