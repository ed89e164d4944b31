"""A bigram language model that satisfies `TrainableModel`, so learner tests need no policy backend."""

import torch

from stages.policy.base import CompletionScores
from stages.policy.sampling import sampled_logprobs, sampling_entropy


class BigramModel(torch.nn.Module):
    def __init__(self, vocab: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.table = torch.nn.Embedding(vocab, vocab)

    def completion_logprobs(self, prompts, completions, *, temperature=1.0, top_p=1.0):
        width = max(len(c) for c in completions)
        logprobs = torch.zeros(len(completions), width)
        entropy = torch.zeros(len(completions), width)
        mask = torch.zeros(len(completions), width)
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            previous = torch.tensor([prompt[-1], *completion[:-1]])  # [T]
            logits = self.table(previous)  # [T, V]
            row = sampled_logprobs(logits, torch.tensor(completion), temperature=temperature, top_p=top_p)  # [T]
            logprobs = logprobs.index_put((torch.tensor([i]), torch.arange(len(row))), row)
            entropy[i, : len(row)] = sampling_entropy(logits, temperature=temperature, top_p=top_p)
            mask[i, : len(row)] = 1.0
        return CompletionScores(logprobs, mask, entropy)
