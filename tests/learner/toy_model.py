"""A bigram language model that satisfies `TrainableModel`, so learner tests need no policy backend, and a
one-turn group scored by it."""

import torch

from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus, Turn
from stages.policy.base import CompletionScores
from stages.policy.sampling import sampled_logprobs, sampling_entropy


class BigramModel(torch.nn.Module):
    def __init__(self, vocab: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.table = torch.nn.Embedding(vocab, vocab)

    def completion_logprobs(self, prompts, completions, *, temperature=1.0, top_p=1.0, nucleus=None):
        on = {"device": self.table.weight.device}  # ids and scores where the model is (the learner's device)
        width = max(len(c) for c in completions)
        logprobs = torch.zeros(len(completions), width, **on)
        entropy = torch.zeros(len(completions), width, **on)
        mask = torch.zeros(len(completions), width, **on)
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            previous = torch.tensor([prompt[-1], *completion[:-1]], **on)  # [T]
            logits = self.table(previous)  # [T, V]
            sizes = torch.tensor(nucleus[i], **on) if nucleus and nucleus[i] else None  # [T] recorded at sampling
            row = sampled_logprobs(logits, torch.tensor(completion, **on), temperature=temperature, top_p=top_p,
                                   nucleus=sizes)  # [T]
            logprobs = logprobs.index_put((torch.tensor([i], **on), torch.arange(len(row), **on)), row)
            entropy[i, : len(row)] = sampling_entropy(logits, temperature=temperature, top_p=top_p, nucleus=sizes)
            mask[i, : len(row)] = 1.0
        return CompletionScores(logprobs, mask, entropy)


def toy_group(model, gid, rewards, completion=(3, 4, 5), cut=False, statuses=None, version=0):
    with torch.no_grad():
        old = model.completion_logprobs([[1, 2]], [list(completion)]).logprobs
        old_fail = model.completion_logprobs([[1, 2]], [[6, 7]]).logprobs
    trajectories = [
        Trajectory(
            rollout_index=i,
            turns=[Turn(prompt_ids=[1, 2], token_ids=list(completion) if r > 0 else [6, 7],
                        logprobs=old[0].tolist() if r > 0 else old_fail[0].tolist(), action="a", policy_version=version)],
            reward=r,
            success=r > 0,
            status=(statuses or {}).get(i, TrajectoryStatus.COMPLETE),
        )
        for i, r in enumerate(rewards)
    ]
    return GroupResult(group_id=gid, task_id="t", trajectories=trajectories, cut=cut)
