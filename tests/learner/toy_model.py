"""A bigram language model that satisfies `TrainableModel`, so learner tests need no policy backend."""

import torch


class BigramModel(torch.nn.Module):
    def __init__(self, vocab: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.table = torch.nn.Embedding(vocab, vocab)

    def completion_logprobs(self, prompts, completions):
        width = max(len(c) for c in completions)
        logprobs = torch.zeros(len(completions), width)
        mask = torch.zeros(len(completions), width)
        rows = []
        for prompt, completion in zip(prompts, completions, strict=True):
            previous = torch.tensor([prompt[-1], *completion[:-1]])  # [T]
            targets = torch.tensor(completion)  # [T]
            logits = self.table(previous).log_softmax(-1)  # [T, V]
            rows.append(logits.gather(1, targets[:, None]).squeeze(1))  # [T]
        for i, row in enumerate(rows):
            logprobs = logprobs.index_put((torch.tensor([i]), torch.arange(len(row))), row)
            mask[i, : len(row)] = 1.0
        return logprobs, mask
