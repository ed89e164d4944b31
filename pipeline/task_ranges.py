"""Task ranges: each held-out split cut into `dev`, `valid` and `test`, so a verdict reads tasks no tuning saw.

    dev    what tuning, probes and bench/ tools look at (the first tasks of each split: every figure measured
           before the ranges existed, on "the first 200 held-out tasks", is a dev figure)
    valid  what periodic curves (`eval.every`) and stop rules (`run.target_heldout`) watch
    test   the before / after measure of a declared verdict (configs/verdicts/), nothing else; five verdicts have
           read it by now, so it stays for comparison with them
    final  the before / after measure of a verdict declared from issue 56 on (`range = "final"`), nothing else

A split is cut by position, in that order: dev = tasks [0, dev), valid = [dev, dev + valid), test = the next
`test` tasks, final = the `final` tasks after test (`eval.ranges`, 200 / 200 / 400 / 400 by default).

`final` is enforced, not only agreed on: `task_range` refuses it unless the caller names the declared verdict
it measures for (`verdict=`), a config asking for it (`eval.range = "final"`) without `eval.verdict` is a
config error, and `run.py check` refuses an `eval.verdict` that is not a verdict file declaring the final range
(`pipeline/run/checks.py`); the verdict runner sets `eval.verdict` itself (`pipeline.verdict.HARNESS_KEYS`).
Tools (`bench/`) offer `RANGES` only. tests/pipeline/test_final_range.py holds that nothing else in the source or
in configs/ names the range. Positions are stable wherever a suite's task list is:
the household env generates each split prefix-stably from `env.options.seed` (never from `run.seed`), and the
TextWorld and ALFWorld adapters list their game files sorted. A split shorter than the three ranges leaves the
later ones short or empty (ALFWorld's valid_seen holds 140 games: set `eval.ranges` to fit it); a measure on a
short range is measured on what there is, with a warning.

Ranges cut held-out splits only: the warm start (behaviour cloning, DAgger), the allocator's train tasks and
every other training path read the `train` split, which no held-out task belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import structlog

from .contracts import Task

log = structlog.get_logger(__name__)

RANGES = ("dev", "valid", "test")
"""The ranges any run or tool may read, in the order they are cut from the start of a split."""
FINAL = "final"
"""The range after test, read only by a declared verdict's runs (above)."""
CUT_ORDER = (*RANGES, FINAL)
"""Every range, in the order they are cut."""
CURVE_RANGES = ("dev", "valid")
"""Where periodic measures and stop rules may look (never test, never final)."""
DEFAULT_SIZES = {"dev": 200, "valid": 200, "test": 400, FINAL: 400}
"""Tasks per split in each range by default (`eval.ranges`); warm-start reports read the default dev range."""


def range_bounds(sizes: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """[start, stop) of each range within a held-out split, cut in the order dev, valid, test, final (a size not
    given is 0)."""
    bounds, start = {}, 0
    for name in CUT_ORDER:
        size = sizes.get(name, 0)
        if size < 0:
            raise ValueError(f"range {name!r} has a negative size ({size})")
        bounds[name] = (start, start + size)
        start += size
    return bounds


def task_range(
    tasks: Sequence[Task], name: str, sizes: Mapping[str, int], count: int | None = None, *, verdict: str = ""
) -> list[Task]:
    """The tasks of range `name` of one held-out split (`tasks`, the whole split in its stable order); with
    `count`, only the range's first `count` (a larger count than the range holds is an error). The final range
    only for a declared verdict's run (`verdict`: its name)."""
    if name not in CUT_ORDER:
        raise ValueError(f"unknown task range {name!r} (known: {', '.join(RANGES)})")
    if name == FINAL and not verdict:
        raise ValueError(f"the {FINAL!r} range is read only by a declared verdict's runs (configs/verdicts/, range = {FINAL!r})")
    start, stop = range_bounds(sizes)[name]
    if count is not None:
        if count > stop - start:
            raise ValueError(f"{count} tasks asked of range {name!r}, which holds {stop - start} per split")
        stop = start + count
    return list(tasks[start:stop])


def heldout_ranges(
    tasks_of: Callable[[str], Sequence[Task]], splits: Sequence[str], name: str, sizes: Mapping[str, int], count: int,
    *, verdict: str = "",
) -> dict[str, list[Task]]:
    """The first `count` tasks of range `name` of each split (`tasks_of(split)`: the suite's whole split). A split
    whose range is empty is left out with a warning (its success would read 0 %), a short one is kept with one."""
    chosen: dict[str, list[Task]] = {}
    for split in splits:
        tasks = task_range(tasks_of(split), name, sizes, count, verdict=verdict)
        if not tasks:
            log.warning("eval.empty_range", split=split, range=name, note="no task of this split falls in the range: not measured")
            continue
        if len(tasks) < count:
            log.warning("eval.short_range", split=split, range=name, tasks=len(tasks), asked=count,
                        note="the split ends inside the range (set eval.ranges to fit it)")
        chosen[split] = tasks
    return chosen
