"""The experiment harness behind `run.py ab`: arms x seeds on one workload (an A/A control arm always among
them, arms rotated per seed), a report of per-seed geometric-mean ratios and paired differences with Student-t
intervals, marked "not resolved" within the A/A noise floor, and plots (docs/ab.md).

Mechanism only: runs are child processes of `run.py` and config validation is injected (`load`), so
nothing here imports stages/, gates/ or learner/.
"""

from ._cli import DEFAULT_ARMS as DEFAULT_ARMS
from ._cli import main as main
from ._cli import write_report as write_report
from ._presets import Preset as Preset
from ._presets import find_presets as find_presets
from ._presets import flatten as flatten
from ._report import build_report as build_report
from ._stats import paired_difference as paired_difference
from ._stats import paired_ratio as paired_ratio

__all__ = ["DEFAULT_ARMS", "Preset", "build_report", "find_presets", "flatten", "main", "paired_difference", "paired_ratio", "write_report"]
