"""glibc malloc settings apply (in a child process: they are process-wide), peak RSS is read, and the heap is frozen."""

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.memory import frozen_heap, peak_rss_mb, trim

ROOT = Path(__file__).resolve().parents[2]
GLIBC = sys.platform.startswith("linux") and "glibc" in " ".join(__import__("platform").libc_ver())


def _applied(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", f"import json; from pipeline.memory import tune_malloc; print(json.dumps({code}))"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_arena_cap_and_fixed_mmap_threshold_are_applied_on_glibc():
    assert _applied("tune_malloc(arenas=2, fixed_mmap=True)") == {"arenas": True, "fixed_mmap": True}
    assert _applied("tune_malloc(arenas=0)") == {"arenas": False, "fixed_mmap": False}


def test_trim_and_peak_rss_report_plausibly():
    assert isinstance(trim(), bool)
    assert 10 < peak_rss_mb() < 100_000


def test_the_heap_alive_at_the_start_is_out_of_the_collectors_way() -> None:
    # A full collection traverses every tracked object with the GIL held: what is frozen it skips (issue 60,
    # item 13: the event loop's lag while the learner thread allocates).
    long_lived = [[i] for i in range(20_000)]
    tracked = len(gc.get_objects())  # what a full collection traverses
    with frozen_heap() as frozen:
        assert frozen >= len(long_lived) and gc.get_freeze_count() >= len(long_lived)
        assert len(gc.get_objects()) < tracked - len(long_lived)
        gc.collect()  # a collection inside the block leaves the frozen objects alone
        assert gc.get_freeze_count() >= len(long_lived) and len(gc.get_objects()) < tracked - len(long_lived)
    assert gc.get_freeze_count() == 0 and len(gc.get_objects()) >= len(long_lived)
    with frozen_heap(enabled=False) as frozen:
        assert frozen == 0 and gc.get_freeze_count() == 0
