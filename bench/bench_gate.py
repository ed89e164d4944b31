"""Gate cost per decision (G=8, K=10): goal <= 25 us.

    python bench/bench_gate.py

The zero-variance gate's decision (issue 57: <= 25 us p50 on the event loop) is measured last: the features
of a group at checkpoint K from its members' prefix sums, d_K included, and p from a fitted model's
coefficients (`gates.zero_variance_features`, `gates.zero_variance_model.probability`), one decision at a
time, p50 and p90 of thread CPU time; and its streaming cost (every observe() call / decisions).

Measures `mean_prefix_edit_distance` on synthetic ALFWorld-like groups (70% near-duplicate rollouts, as in
feasibility.md §3) side by side with a plain-Python dynamic-programming Levenshtein baseline and with
rapidfuzz over raw lists of strings, and the full streaming gate (observe() of every step of a group).
The goal is checked on back-to-back decisions (warm caches); the "cold" line runs unrelated work between
decisions, as the pipeline does (policy batches, env steps), and shows what a run's summary reports.
"""

from __future__ import annotations

import random
import statistics
import time
from itertools import combinations

from rapidfuzz.distance import Levenshtein

from gates import END, PrefixEditDistanceGate, mean_prefix_edit_distance
from gates.zero_variance import ZeroVarianceGate
from gates.zero_variance_features import MemberSteps, feature_names, feature_vector
from gates.zero_variance_model import LinearModel, probability
from pipeline.messages import GroupOpened, StepEvent

G, K = 8, 10
VERBS = ["go to {r}", "open {r}", "close {r}", "take {o} from {r}", "put {o} in/on {r}", "examine {r}", "look"]
RECEPTACLES = [f"{name} {i}" for name in ("cabinet", "drawer", "countertop", "fridge", "shelf") for i in range(1, 5)]
OBJECTS = [f"{name} {i}" for name in ("mug", "apple", "knife", "book") for i in range(1, 3)]


def _action(rng: random.Random) -> str:
    return rng.choice(VERBS).format(r=rng.choice(RECEPTACLES), o=rng.choice(OBJECTS))


def make_group(rng: random.Random) -> list[list[str]]:
    base = [_action(rng) for _ in range(rng.randint(8, 30))]
    group = []
    for _ in range(G):
        if rng.random() < 0.7:  # near duplicate of the base trajectory
            seq = [a if rng.random() > 0.1 else _action(rng) for a in base]
        else:
            seq = [_action(rng) for _ in range(rng.randint(1, 30))]
        group.append(seq)
    return group


def _dp(a: list[str], b: list[str]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def plain_python(group: list[list[str]], k: int) -> float:
    pads = [list(a[:k]) + [END] * (k - len(a[:k])) for a in group]
    pairs = list(combinations(range(len(pads)), 2))
    return sum(_dp(pads[i], pads[j]) for i, j in pairs) / (len(pairs) * k)


def rapidfuzz_lists(group: list[list[str]], k: int) -> float:
    pads = [list(a[:k]) + [END] * (k - len(a[:k])) for a in group]
    pairs = list(combinations(range(len(pads)), 2))
    return sum(Levenshtein.distance(pads[i], pads[j]) for i, j in pairs) / (len(pairs) * k)


def per_call_us(fn, groups, rounds: int = 5) -> float:
    best = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for g in groups:
            fn(g, K)
        best.append((time.perf_counter() - t0) / len(groups) * 1e6)
    return min(best)


def cold_us(groups) -> float:
    """Median thread-CPU us per decision with the caches flushed by unrelated work before each one."""
    scratch = bytearray(16 << 20)
    times = []
    for g in groups:
        bytes(scratch)  # copying 16 MB evicts the data caches
        sorted(str(i) for i in range(5000))  # and unrelated Python code evicts the interpreter's paths
        t0 = time.thread_time()
        mean_prefix_edit_distance(g, K)
        times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e6


def streaming_us(groups) -> float:
    gate = PrefixEditDistanceGate(PrefixEditDistanceGate.Options(k=K, tau=0.12))
    events = []
    for gid, group in enumerate(groups):
        for s in range(K):
            for r, seq in enumerate(group):
                if s < len(seq):
                    events.append(StepEvent(group_id=gid, rollout_index=r, step_index=s, action=seq[s],
                                            done=s == len(seq) - 1, reward=0.0, policy_version=0))
    for gid in range(len(groups)):
        gate.open(gid, G)
    t0 = time.perf_counter()
    decisions = sum(gate.observe(e) is not None for e in events)
    elapsed = time.perf_counter() - t0
    return elapsed / max(decisions, 1) * 1e6, decisions, len(events)


def _events(gid: int, group: list[list[str]], rng: random.Random) -> list[StepEvent]:
    return [StepEvent(group_id=gid, rollout_index=r, step_index=s, action=seq[s], done=s == len(seq) - 1, reward=0.0,
                      policy_version=0, admissible=rng.random() < 0.8, new_observation=rng.random() < 0.6,
                      logprob=-rng.random() * 3, entropy=rng.random() * 2)
            for s in range(K) for r, seq in enumerate(group) if s < len(seq)]


TASK_FEATURES = {f"f{i}": float(i) for i in range(11)}  # as many as a household task has


def zero_variance_decision_us(groups: list[list[list[str]]]) -> tuple[float, float, float]:
    """p50, p90 thread-CPU us of one decision at K (features from prefix sums + p from the coefficients), and
    side by side, interleaved, the p50 of the prefix gate's d_K alone (a machine's load scales both)."""
    rng = random.Random(1)
    width = len(feature_names(sorted(TASK_FEATURES)))
    model = LinearModel(coef=[rng.gauss(0, 1) for _ in range(width)], intercept=0.0, threshold=0.9)
    prompt = [0.3, 0.0, 1.0, *TASK_FEATURES.values()]
    times, prefix = [], []
    for gid, group in enumerate(groups):
        table: dict[str, str] = {}
        members = [MemberSteps(table) for _ in group]
        for event in _events(gid, group, rng):
            members[event.rollout_index].add(event)
        t0 = time.thread_time_ns()
        probability(model, feature_vector(prompt, members, K, 5)) >= model.threshold  # noqa: B015 (the decision)
        t1 = time.thread_time_ns()
        mean_prefix_edit_distance(group, K)
        prefix.append((time.thread_time_ns() - t1) / 1e3)
        times.append((t1 - t0) / 1e3)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.9)], statistics.median(prefix)


def zero_variance_streaming_us(groups: list[list[list[str]]]) -> tuple[float, int, int]:
    """Every observe() call of each group (checkpoints 2..10, no member won) / the decisions they made."""
    rng = random.Random(2)
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(checkpoints=[2, 4, 6, 8, 10], warmup=1, explore=0.0))
    width = len(feature_names(sorted(TASK_FEATURES)))
    gate.install(dict.fromkeys(gate.ks, LinearModel(coef=[0.0] * width, intercept=-5.0, threshold=0.99)))
    events = []
    for gid, group in enumerate(groups):
        gate.opened(GroupOpened(group_id=gid, task_id="t", size=G, policy_version=0, admitted_at=0.0, family="f",
                                split="train", features=TASK_FEATURES))
        gate.open(gid, G)
        events += _events(gid, group, rng)
    t0 = time.perf_counter()
    decisions = sum(gate.observe(e) is not None for e in events)
    return (time.perf_counter() - t0) / max(decisions, 1) * 1e6, decisions, len(events)


def main() -> None:
    rng = random.Random(0)
    groups = [make_group(rng) for _ in range(2000)]
    for g in groups[:200]:
        assert abs(mean_prefix_edit_distance(g, K) - plain_python(g, K)) < 1e-12
    ours = per_call_us(mean_prefix_edit_distance, groups)
    lists = per_call_us(rapidfuzz_lists, groups)
    plain = per_call_us(plain_python, groups[:300], rounds=2)
    stream_total, decisions, events = streaming_us(groups)
    cold = cold_us(groups[:300])
    cut = statistics.mean(mean_prefix_edit_distance(g, K) < 0.12 for g in groups)
    print(f"gate decision, G={G}, K={K}, {len(groups)} synthetic groups (cut rate at tau=0.12: {cut:.0%})")
    print(f"  mean_prefix_edit_distance      {ours:7.1f} us/decision   goal <= 25 us: {'met' if ours <= 25 else 'MISSED'} ({25 / ours:.2f}x headroom)")
    print(f"  rapidfuzz on raw string lists  {lists:7.1f} us/decision   ours is {lists / ours:.2f}x faster")
    print(f"  plain-Python DP Levenshtein    {plain:7.1f} us/decision   ours is {plain / ours:.1f}x faster")
    print(f"  cold caches (unrelated work between decisions) {cold:7.1f} us/decision (median thread CPU): {cold / ours:.1f}x the warm figure")
    print(f"  streaming gate (all observe() calls of a group / decisions) {stream_total:7.1f} us per decision ({events} events, {decisions} decisions)")
    p50, p90, prefix_p50 = zero_variance_decision_us(groups)
    zv_stream, zv_decisions, zv_events = zero_variance_streaming_us(groups)
    print(f"zero-variance gate decision at K={K} ({len(TASK_FEATURES)} task features): p50 {p50:.1f} us, p90 {p90:.1f} us "
          f"(thread CPU; goal p50 <= 25 us: {'met' if p50 <= 25 else 'MISSED'}); {p50 / prefix_p50:.2f}x the prefix gate's "
          f"d_K alone measured beside it (p50 {prefix_p50:.1f} us)")
    print(f"  streaming zero-variance gate (all observe() calls / decisions) {zv_stream:7.1f} us per decision "
          f"({zv_events} events, {zv_decisions} decisions)")


if __name__ == "__main__":
    main()
