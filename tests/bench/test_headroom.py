"""bench/headroom.py rebuilds an episode's prompts by replaying its actions: the same steps collect_demos records."""

from __future__ import annotations

from stages.envs.household import HouseholdSuite
from stages.policy.torch_tiny import PromptFormat, WordTokenizer
from stages.policy.torch_tiny._pretrain import collect_demos

from . import bench_module


def _headroom():
    return bench_module("headroom")


def test_replaying_the_experts_actions_rebuilds_its_demonstrations():
    suite = HouseholdSuite()
    fmt = PromptFormat(WordTokenizer.from_vocabulary(suite.vocabulary()), history=3, max_prompt_tokens=120, memory=True)
    tasks = list(suite.tasks("train"))[:5]
    episodes, failed = collect_demos(suite, tasks, fmt)
    assert failed == 0
    for task, demos in zip(tasks, episodes, strict=True):
        actions = [fmt.tokenizer.decode(d.completion[:-1]) for d in demos]
        assert _headroom().replay(suite, fmt, task, actions) == demos
