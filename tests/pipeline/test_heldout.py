"""Periodic held-out measures: which versions are measured, rows written, target and idleness as events."""

import trio

from pipeline.heldout import PeriodicHeldout


class _Metrics:
    def __init__(self):
        self.rows = []

    def write(self, row):
        self.rows.append(row)


async def test_due_versions_are_measured_in_the_background_and_the_target_is_an_event(autojump_clock):
    measured, kept = [], []

    async def evaluate(version, state):
        measured.append((version, state["w"]))
        await trio.sleep(10.0)
        return {"seen": 0.3, "unseen": 0.5, "mean": 0.4 + 0.1 * version / 4}

    metrics = _Metrics()
    heldout = PeriodicHeldout(evaluate, 2, 6, metrics, None, on_row=lambda row, s: kept.append((row, s)), target=0.5)
    async with trio.open_nursery() as nursery:
        for version in range(1, 7):
            heldout.published(version, {"w": version})
            heldout.start_if_due(version, nursery, wall_s=lambda: 1.0, env_steps=lambda: 100)
        await trio.testing.wait_all_tasks_blocked()
        assert not heldout.target_reached.is_set()
        await heldout.idle()
    assert sorted(measured) == [(2, 2), (4, 4)]  # every 2nd version; the last (6) is the job's after-measure
    rows = sorted(metrics.rows, key=lambda r: r["iteration"])  # concurrent measures end in either order
    assert [r["iteration"] for r in rows] == [2, 4] and rows[0]["heldout/mean"] == 0.45
    assert [s for _, s in kept] == [10.0, 10.0]
    assert heldout.target_reached.is_set()  # version 4 scored 0.5
