"""The GRPO phase's small runtime helpers: the GIL switch interval it runs under."""

from __future__ import annotations

import sys

from pipeline.config import RunSection
from pipeline.run.runtime import gil_switch_interval


def test_the_phase_hands_the_gil_over_sooner_and_restores_python_s_interval() -> None:
    # The loop gives the GIL up at every socket wait and zmq call; while the learner's thread runs Python code
    # each one cost up to 5 ms (issue 60, item 13: loop lag p99 while the learner trains).
    before = sys.getswitchinterval()
    with gil_switch_interval(RunSection().gil_switch_ms):
        assert sys.getswitchinterval() == RunSection().gil_switch_ms / 1000 < before
    assert sys.getswitchinterval() == before
    with gil_switch_interval(0):
        assert sys.getswitchinterval() == before  # 0: Python's own
    assert RunSection(gil_switch_ms=-1).problems() == ["run.gil_switch_ms must be >= 0 (0 = Python's 5 ms)"]
