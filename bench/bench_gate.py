"""Gate cost per decision (G=8, K=10): goal <= 25 us.

    python bench/bench_gate.py

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
from pipeline.messages import StepEvent

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


if __name__ == "__main__":
    main()
