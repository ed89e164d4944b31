"""What choosing whole commands costs the learner: one forward + backward, token trie vs whole commands.

    .venv/bin/python bench/bench_command_choice.py [--prompts 64] [--prompt-tokens 200] [--commands 10 19 40]

The preset's model shape (policy.options defaults), random weights and tokens (the cost does not depend on
them), one torch thread. Per number of commands per state, `completion_logprobs` of the chosen command
under the token trie (`choose_by = "token"`) and under the command policy (`choose_by = "command"`, every
command scored in one packed row), each timed `--repeat` times interleaved, best of each; prints seconds
and the ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages.policy.torch_tiny import ModelConfig, TinyLM  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64, help="prompts per micro-batch (learner.micro_batch)")
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--command-tokens", type=int, default=6)
    parser.add_argument("--commands", type=int, nargs="+", default=[10, 19, 40])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyLM(ModelConfig(vocab_size=169, pad_id=0))
    print("| commands per state | token trie s | whole commands s | ratio |\n|---|---|---|---|")
    for k in args.commands:
        prompts = [torch.randint(5, 169, (args.prompt_tokens,)).tolist() for _ in range(args.prompts)]
        choices = [[torch.randint(5, 169, (args.command_tokens,)).tolist() for _ in range(k)] for _ in prompts]
        chosen = [c[0] for c in choices]
        best = {"token": float("inf"), "command": float("inf")}
        for _ in range(args.repeat):
            for mode in best:
                model.choose_by = mode
                model.zero_grad(set_to_none=True)
                start = time.perf_counter()
                scores = model.completion_logprobs(prompts, chosen, temperature=0.7, top_p=1.0, choices=choices)
                scores.logprobs.sum().backward()
                best[mode] = min(best[mode], time.perf_counter() - start)
        print(f"| {k} | {best['token']:.2f} | {best['command']:.2f} | {best['command'] / best['token']:.2f} |")


if __name__ == "__main__":
    main()
