"""What the zero-variance predictor reads: a group's features at checkpoint k, as pure functions.

Two halves, concatenated (`feature_vector`):

* the prompt side, known at admission (k = 0): the family's recent success (a decayed rate over the
  labels the gate has seen), whether the task's split is an unseen layout, the policy version (log1p), and
  the task's own numeric features (`Task.features`, in a fixed order of names);
* the group's steps before k (zero at k = 0): members' progress in the last `window` steps (the stall
  gate's statistic), the fraction that already ended, the admissible and new-observation rates, the
  prefix edit distance d_k (the Selective Rollout statistic), the agreement of the members' latest
  actions, and the behaviour log-prob and choice entropy of the actions: their means and trends (the mean
  over the second half of the prefix minus the first half's).

`MemberSteps` keeps a member's events as prefix sums and its actions as a string of code points (one table
per group), so the features at k cost O(G) plus d_k's pairwise distances, whatever the length of the prefix:
the decision stays within the gate's budget (bench/bench_gate.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.messages import StepEvent

from .prefix import action_code, coded_prefix_distance

PROMPT_FEATURES = ("family_success", "unseen", "policy_version")
"""The prompt side's fixed part; the task's own features follow, named `task/<name>`."""
STEP_FEATURES = (
    "progress", "ended", "admissible", "new_observation", "prefix_distance", "agreement",
    "logprob", "logprob_trend", "entropy", "entropy_trend",
)


@dataclass(slots=True)
class MemberSteps:
    """One member's step stream as prefix sums: e.g. `admissible[i]` is the sum over its first i steps.
    Members of one group share `table`, so `code` (one code point per action) compares across them."""

    table: dict[str, str] = field(default_factory=dict)
    code: str = ""
    actions: list[str] = field(default_factory=list)
    admissible: list[float] = field(default_factory=lambda: [0.0])
    new_observation: list[float] = field(default_factory=lambda: [0.0])
    progress: list[float] = field(default_factory=lambda: [0.0])
    logprob: list[float] = field(default_factory=lambda: [0.0])
    entropy: list[float] = field(default_factory=lambda: [0.0])
    done_at: int | None = None
    """Steps it took when it ended (done or failed); None while running."""

    def add(self, event: StepEvent) -> None:
        self.actions.append(event.action)
        self.code += action_code(self.table, event.action)
        self.admissible.append(self.admissible[-1] + event.admissible)
        self.new_observation.append(self.new_observation[-1] + event.new_observation)
        self.progress.append(self.progress[-1] + (event.admissible and event.new_observation))
        self.logprob.append(self.logprob[-1] + (event.logprob or 0.0))
        self.entropy.append(self.entropy[-1] + (event.entropy or 0.0))
        if event.done:
            self.done_at = len(self.actions)

    def fail(self) -> None:
        if self.done_at is None:
            self.done_at = len(self.actions)

    def __len__(self) -> int:
        return len(self.actions)


def prompt_vector(
    family_success: float, split: str, policy_version: int, features: Mapping[str, float], names: Sequence[str]
) -> list[float]:
    """The prompt side [len(PROMPT_FEATURES) + len(names)]: `names` fixes the order of the task features
    (a missing one reads 0)."""
    head = [family_success, float("unseen" in split), math.log1p(max(policy_version, 0))]
    return head + [float(features.get(name, 0.0)) for name in names]


def step_vector(members: Sequence[MemberSteps], k: int, window: int) -> list[float]:
    """The group's features at checkpoint k [len(STEP_FEATURES)] from each member's steps before k. The hot path
    of every zero-variance decision (goal <= 25 us with d_k, bench/bench_gate.py): one pass, locals only."""
    if k <= 0:
        return [0.0] * len(STEP_FEATURES)
    g = len(members)
    steps = 0
    progress = progress_steps = admissible = new_obs = logprob = entropy = logprob_trend = entropy_trend = 0.0
    ended = agree = 0
    latest: dict[str, int] = {}
    for m in members:
        n = len(m.actions)
        if n > k:
            n = k
        done_at = m.done_at
        if done_at is not None and done_at <= k:
            ended += 1
        elif n:
            lo = n - window if n > window else 0  # a running member's last `window` steps: the stall gate's statistic
            progress += m.progress[n] - m.progress[lo]
            progress_steps += n - lo
        if not n:
            continue
        steps += n
        admissible += m.admissible[n]
        new_obs += m.new_observation[n]
        lp, en = m.logprob, m.entropy
        logprob += lp[n]
        entropy += en[n]
        if n >= 2:  # trends: the mean over steps [n//2, n) less the mean over [0, n//2)
            h = n // 2
            logprob_trend += (lp[n] - lp[h]) / (n - h) - lp[h] / h
            entropy_trend += (en[n] - en[h]) / (n - h) - en[h] / h
        last = m.code[n - 1]
        count = latest[last] = latest.get(last, 0) + 1
        if count > agree:
            agree = count
    if not steps:
        return [1.0, ended / g] + [0.0] * (len(STEP_FEATURES) - 2)
    return [
        progress / progress_steps if progress_steps else 1.0,
        ended / g,
        admissible / steps,
        new_obs / steps,
        coded_prefix_distance([m.code for m in members], k),
        agree / g,
        logprob / steps,
        logprob_trend / g,
        entropy / steps,
        entropy_trend / g,
    ]


def feature_names(task_features: Sequence[str]) -> list[str]:
    """Every feature's name, in `feature_vector` order."""
    return [*PROMPT_FEATURES, *(f"task/{name}" for name in task_features), *STEP_FEATURES]


def feature_vector(prompt: Sequence[float], members: Sequence[MemberSteps], k: int, window: int) -> list[float]:
    return [*prompt, *step_vector(members, k, window)]
