"""The loop watch: which task steps and wake-ups held the Trio loop, on a fake clock the tasks advance (a step
"takes" what its task adds), so nothing here depends on the machine's speed."""

import json

import trio

from pipeline.profiling import Profiler
from pipeline.run.loop_watch import LOOP_STAGE, SLOW_S, WAKE_UP, LoopWatch, blockers, blockers_table, watching


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _slow_and_fast(clock: FakeClock) -> None:
    async def slow() -> None:
        for _ in range(3):
            clock.now += 0.005  # a 5 ms step: work on the loop's thread
            await trio.lowlevel.checkpoint()

    async def fast() -> None:
        for _ in range(10):
            clock.now += 0.0001
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow, name="slow-task")
        nursery.start_soon(fast, name="fast-task")


async def test_a_slow_task_step_is_kept_by_name_and_a_fast_one_is_not():
    clock, blocks = FakeClock(), {}
    with watching(LoopWatch(blocks, clock=clock)):
        await _slow_and_fast(clock)
    assert set(blocks) == {"slow-task"}
    count, total, longest = blocks["slow-task"]
    assert count == 3 and abs(total - 0.015) < 1e-9 and abs(longest - 0.005) < 1e-9
    (row,) = blockers(blocks)
    assert row == {"name": "slow-task", "count": 3, "total_ms": 15.0, "longest_ms": 5.0}


async def test_the_watch_leaves_the_loop_when_the_block_ends():
    clock, blocks = FakeClock(), {}
    with watching(LoopWatch(blocks, clock=clock)):
        pass
    await _slow_and_fast(clock)
    assert blocks == {}


def test_a_wake_up_after_its_deadline_is_kept_and_an_early_one_is_not():
    clock, blocks = FakeClock(), {}
    watch = LoopWatch(blocks, clock=clock)
    watch.before_io_wait(0.0)  # a poll between ready tasks: back at once, unless the thread waits for the GIL
    clock.now += 0.003
    watch.after_io_wait(0.0)
    watch.before_io_wait(0.010)  # I/O arrived before the deadline: nobody was kept waiting
    clock.now += 0.004
    watch.after_io_wait(0.010)
    watch.before_io_wait(0.010)
    clock.now += 0.010 + SLOW_S / 2  # late, but by less than the threshold
    watch.after_io_wait(0.010)
    assert blocks == {WAKE_UP: [1, blocks[WAKE_UP][1], blocks[WAKE_UP][2]]}
    assert abs(blocks[WAKE_UP][1] - 0.003) < 1e-9


async def test_slow_steps_are_spans_of_the_profiles_loop_track(tmp_path):
    clock, blocks = FakeClock(), {}
    prof = Profiler(gpu_sample_hz=0.0, clock=clock, thread_clock=clock)
    with watching(LoopWatch(blocks, clock=prof.clock, record=lambda n, t0, t1: prof.record(LOOP_STAGE, n, t0, t1))):
        await _slow_and_fast(clock)
    prof.write(tmp_path, plot=False)
    trace = json.loads((tmp_path / "profile.json").read_text())
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and tracks[e["tid"]] == LOOP_STAGE]
    assert [e["name"] for e in spans] == ["slow-task"] * 3 and all(abs(e["dur"] - 5000.0) < 1e-3 for e in spans)
    row = next(r for r in prof.finish().rows if r.stage == LOOP_STAGE)
    assert row.busy_pct > 0


def test_the_summary_table_names_the_blockers_or_says_there_were_none():
    rows = blockers({"a": [1, 0.002, 0.002], WAKE_UP: [4, 0.020, 0.006], "b": [9, 0.0185, 0.0021]})
    assert [r["name"] for r in rows] == [WAKE_UP, "b", "a"]
    table = blockers_table(rows, 9.9)
    assert "lag p99 9.9 ms" in table and "| `(wake-up)` | 4 | 20.0 | 6.0 |" in table
    assert "no task step or wake-up held the loop" in blockers_table([], 0.4)
