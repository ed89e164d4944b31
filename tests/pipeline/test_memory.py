"""glibc malloc settings apply (in a child process: they are process-wide), and peak RSS is read."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.memory import peak_rss_mb, trim

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
