"""Process memory: peak RSS for the summary, and glibc malloc settings that keep RSS from creeping.

Measured with bench/bench_memory.py (default config, N = 300 env steps): with glibc's defaults RSS was
803 MB after 480 env steps and 1067 MB after 3120 (rss_growth 0.33, peak 1217 MB); with large blocks
always mmap-ed (M_MMAP_THRESHOLD = 128 KiB) it was 353 MB and 384 MB (growth 0.09, peak 502 MB). The
default's *dynamic* threshold rises each time a large block is freed, after which torch's many short-lived
tensors (KV caches, activations, weight snapshots) of varying sizes come from the heap arenas of the
policy and learner threads and fragment them. Setting the threshold explicitly turns the dynamic
adjustment off, so freed tensors go back to the OS.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys

M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024


def tune_malloc() -> bool:
    """Fix glibc's mmap threshold (Linux/glibc only); returns whether it was applied."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (e.g. musl)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def peak_rss_mb() -> float:
    """The process's peak resident set size so far (ru_maxrss, KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
