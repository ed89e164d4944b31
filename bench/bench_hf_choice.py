"""What choosing among the admissible commands costs a Hugging Face model: the shared prompt KV cache against
scoring each command with its own forward of prompt + command.

    HF_HUB_OFFLINE=1 nice -n 19 python bench/bench_hf_choice.py [--config configs/smollm2-choose.toml]
                                                              [--contexts 8] [--repeat 2] [--set ...]

Real household contexts (the expert's first steps on the first train tasks of the config's env), prompts
built as the hf backend builds them, the config's model (`policy.model`), one torch thread, no grad. Per
context: `_scoring.row_scores` (prefill once, the commands on the repeated cache) and the same scores from one
right-padded batch of K rows `prompt + command` (what vLLM's prompt log-probs compute, since vLLM ignores
its prefix cache for requests that ask for them); each timed `--repeat` times interleaved, best of each. Prints
tokens per context, scored commands / s and prompt tokens / s of both, and their ratio: a ratio measured side
by side holds on a loaded machine, the absolute rates do not.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.run import build  # noqa: E402
from pipeline.run.checks import load  # noqa: E402
from stages.policy.base import AgentContext  # noqa: E402
from stages.policy.hf._scoring import row_scores  # noqa: E402
from stages.policy.hf._server import command_choices  # noqa: E402


def contexts(suite, n: int) -> list[AgentContext]:  # noqa: ANN001
    """The states the expert passes through on the first train tasks (up to 3 per task), `n` in all."""
    out: list[AgentContext] = []
    for task in suite.tasks("train"):
        env = suite.make()
        obs, history = env.reset(task), []
        for action in suite.expert(task)[:3]:
            out.append(AgentContext(task.description, obs.text, obs.admissible, tuple(history)))
            history.append((obs.text, action))
            obs = env.step(action).observation
        env.close()
        if len(out) >= n:
            return out[:n]
    return out


@torch.inference_mode()
def full_forward_scores(lm, prompt: list[int], commands: list[list[int]]) -> torch.Tensor:  # noqa: ANN001
    """log p(c | prompt) [K] from one batch of K right-padded rows prompt + command (no cache)."""
    rows = [[*prompt, *c] for c in commands]
    L = max(map(len, rows))
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    attention = torch.zeros(len(rows), L, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
    h = lm.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state  # [K, L, D]
    scores = []
    for i, c in enumerate(commands):
        at = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(c))
        logp = lm.get_output_embeddings()(h[i, at]).float().log_softmax(-1)  # [len(c), V]
        scores.append(logp.gather(-1, torch.tensor(c)[:, None]).sum())
    return torch.stack(scores)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/smollm2-choose.toml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--contexts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from stages.policy.hf import hf_backend

    cfg = load(args.config, args.overrides)
    suite = build.suite(cfg)
    policy = hf_backend(cfg.policy, cfg.pretrain, suite, seed=0)
    lm, prompt = policy.model, policy.prompt
    rows = []
    for ctx in contexts(suite, args.contexts):
        rows.append((prompt.build(ctx), command_choices(prompt, ctx.admissible)[1]))
    best = {"shared": float("inf"), "full": float("inf")}
    for _ in range(args.repeat):
        for mode in best:
            start = time.perf_counter()
            for p, commands in rows:
                if mode == "shared":
                    with torch.inference_mode():
                        row_scores(lm, p, commands)
                else:
                    full_forward_scores(lm, p, commands)
            best[mode] = min(best[mode], time.perf_counter() - start)
    for p, commands in rows[:2]:  # the two computations agree
        with torch.inference_mode():
            torch.testing.assert_close(row_scores(lm, p, commands), full_forward_scores(lm, p, commands), atol=1e-3, rtol=1e-4)
    n = len(rows)
    prompt_tokens = sum(len(p) for p, _ in rows)
    commands = sum(len(c) for _, c in rows)
    command_tokens = sum(len(t) for _, c in rows for t in c)
    print(f"{n} contexts: {prompt_tokens / n:.0f} prompt tokens, {commands / n:.1f} commands, "
          f"{command_tokens / n:.0f} command tokens per context (model {cfg.policy.model}, 1 torch thread)")
    print("| scoring | s | contexts / s | scored commands / s | prompt tokens / s |\n|---|---|---|---|---|")
    for mode, label in (("shared", "prompt KV cache shared (hf backend)"), ("full", "one forward per command (prompt log-probs)")):
        s = best[mode]
        print(f"| {label} | {s:.2f} | {n / s:.2f} | {commands / s:.1f} | {prompt_tokens / s:.0f} |")
    print(f"\nratio full / shared: {best['full'] / best['shared']:.2f}")


if __name__ == "__main__":
    main()
