"""Process memory: peak RSS for the summary, and glibc malloc settings that keep RSS from creeping.

Where it went (bench/bench_memory.py, default config, RSS at N and 10 N env steps): Python objects barely
grow (tracemalloc: ~1 MB over 2,640 steps, profiler spans and in-flight frames; gc object counts flat but
for ~2 span tuples per env step). RSS growth is glibc heap fragmentation: torch's short-lived tensors (KV
caches, activations, weight snapshots) of varying sizes are allocated and freed by several threads
(policy, learner, Trio's worker threads, torch's), each with an arena of its own (glibc allows 8 per
core), and every arena keeps the high-water mark of its holes.

Side by side (--compare, N = 1,000, four processes at nice 19 beside other work):

    glibc defaults                  RSS 625 -> 950 MB  rss_growth 0.52   15.0 env-steps/s
    M_ARENA_MAX = 2                 RSS 641 -> 650 MB  rss_growth 0.01   15.1 env-steps/s
    M_MMAP_THRESHOLD = 128 KiB      RSS 373 -> 366 MB  rss_growth -0.02  12.1 env-steps/s   (run.flat_memory)
    M_MMAP_THRESHOLD = 1 MiB        RSS 383 -> 369 MB  rss_growth -0.04  12.2 env-steps/s

and in other runs: malloc_trim(0) at every update 0.46 (three processes, N = 1,000: no better than the
defaults, glibc 0.45 there); 2 arenas alone 0.23 (one process, N = 1,000), 0.18 / 0.26 set in run_job /
from process start (N = 500) and 0.41 (beside flat: -0.05 at 0.86x its speed, N = 1,000), so the cap does
not stop the creep and `run.malloc_arenas` stays off by default; the fixed threshold's speed was 0.98x,
0.80x, 0.90x and 0.86x of the others in four comparisons. The fixed mmap threshold (`run.flat_memory`; M_TRIM_THRESHOLD would
do the same, since setting either turns glibc's *dynamic* threshold off) is what keeps RSS flat: every large
tensor gets its own mmap, returned to the OS on free, ~40 % less RSS, up to ~20 % slower (a page-faulting
mmap per tensor). malloc_trim gives back only whole free pages, and the holes are not.

Peak RSS (issue 60, item 13: 2.7-3.6 GB in default runs of a 265 k-parameter policy). One learner micro-batch
of the default run (64 turns scored by whole commands, `_commands.every_row_scores`, prompts of 120-200 tokens
and 10-40 commands) takes ~300-400 MB of activations. Eight of them, each on a new thread as Trio's worker
threads take the updates, left RSS at 1,139 MB (from 236; peak 1,202): every thread's arena keeps its
high-water mark. On one thread: 699 MB. With `malloc_trim(0)` after each: 262 MB (peak 707, from any thread:
it walks every arena). A fixed 4 MiB mmap threshold did as well (278 MB) at 3x the page faults and ~1.25x the
CPU time. So every learner update ends with `trim()` (`learner.trim_memory`, on by default): its pages fault
in again once per update, not per micro-batch. And the GRPO phase runs inside `frozen_heap` (`run.gc_freeze`):
the ~200 k objects alive when it starts stay out of every full collection, which holds the GIL whichever thread
triggers it. `bench/bench_loop.py` measures both against the defaults before them, side by side.

Where the run's process peaks (RSS sampled every 20 ms, phases labelled; `python run.py --set run.updates=8 --set
eval.tasks=20`, seed 0, commit 3210d30, cached warm start, loaded 2-core machine): 280 MB after the build, 280
through the held-out measure (its episodes decode in the worker processes), ~420 MB between updates, and inside
each learner update a climb from ~420 to 1,000-1,160 MB over its micro-batches (46 rows x 312 packed tokens scored by
whole commands take ~290 MB each on one thread, and one thread alone stays at ~600 MB over 16 of them), back to
~430 at the update's `trim()`. So the peak is the learner update's, and it is fragmentation across the threads
that allocate during it, not one batch. Behaviour cloning in the same process (a fresh warm start, 2 epochs
probed) left RSS at 850-910 MB after it returned (its freed activations and AdamW state in glibc's arenas), the
base every later phase starts from: the job trims after the warm start (`job._build_policy`); on a synthetic BC
of 6 steps in a thread that gave back 140 of the 233 MB it had grown. The decoding workers are processes of their
own (~310 MB each, up to 750 MB during GRPO) and `peak_rss_mb` (RUSAGE_SELF) does not count them; RUSAGE_CHILDREN
would give only the largest child already waited for, not their sum.

So the default run passes 16 turns at a time, not 64 (configs/default.toml, `learner.micro_batch`; the gradient is
the same): a plain `python run.py`'s peak went from 1,442 to 1,076 MB (seed 0, one run each, 2026-11-29; the
summary's `peak_rss_mb_by_phase` puts both peaks in the GRPO phase, 278-301 MB before it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import resource
import sys
from collections.abc import Iterator
from functools import cache

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 128 * 1024


@cache
def _libc() -> ctypes.CDLL | None:
    """glibc, or None (not Linux, or a libc without mallopt/malloc_trim such as musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc


def tune_malloc(*, arenas: int = 0, fixed_mmap: bool = False) -> dict[str, bool]:
    """Cap glibc's malloc arenas (`arenas` > 0) and fix its mmap threshold (`fixed_mmap`); call before the
    threads and tensors exist. Returns what was applied (nothing off glibc, e.g. musl or macOS)."""
    applied = {"arenas": False, "fixed_mmap": False}
    libc = _libc()
    if libc is None:
        return applied
    if arenas > 0:
        applied["arenas"] = bool(libc.mallopt(M_ARENA_MAX, arenas))
    if fixed_mmap:
        applied["fixed_mmap"] = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    return applied


def trim() -> bool:
    """Give the free pages of every malloc arena back to the OS; returns whether any memory was released."""
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))


def peak_rss_mb() -> float:
    """The process's peak resident set size so far (ru_maxrss, KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[int]:
    """Within the block, the objects alive at its start are left out of the cyclic garbage collector
    (`gc.freeze`, after one full collection so that no garbage is frozen); yields how many were frozen (0 when
    not `enabled`). A full collection then traverses only what was allocated inside the block: the
    long-lived heap of a run (imported modules, torch, an environment's tables) is ~200 k objects, a pause
    of that length whichever thread triggers it, with the GIL held. On exit they are handed back
    (`gc.unfreeze`); an object that became cyclic garbage inside the block is collected then."""
    if not enabled:
        yield 0
        return
    gc.collect()
    gc.freeze()
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()
