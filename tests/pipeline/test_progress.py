import io

import pytest
import trio
import trio.testing

from pipeline import progress as progress_module
from pipeline.progress import Progress, format_phase, format_status, report


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_report_without_an_active_display_does_nothing():
    report("warm start", 1, 8, "loss 0.5", final=True)  # no display: no error, nothing to see


def test_off_a_terminal_a_short_phase_prints_only_its_final_line():
    stream = io.StringIO()
    shown = Progress(10, stream=stream)

    async def main() -> None:
        shown.activate()
        report("held-out heldout_seen", 3, 200, "12 s")
        report("held-out heldout_seen", 200, 200, "success 25.0%", final=True)

    trio.run(main)
    assert stream.getvalue() == "held-out heldout_seen 200/200 | success 25.0%\n"


def test_on_a_terminal_reports_refresh_one_line_in_place(monkeypatch):
    clock = iter([99.0, 100.0, 100.1, 100.5, 100.6])  # started at 99; the second refresh comes too soon and is skipped
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    stream = _Terminal()
    shown = Progress(10, stream=stream)
    shown.phase_line("warm start: epoch", 1, 8)
    shown.phase_line("warm start: epoch", 2, 8)
    shown.phase_line("warm start: epoch", 3, 8, "loss 0.4")
    shown.phase_line("warm start: epoch", 8, 8, "done", final=True)
    assert stream.getvalue() == (
        "\r\x1b[2Kwarm start: epoch 1/8"
        "\r\x1b[2Kwarm start: epoch 3/8 | loss 0.4"
        "\r\x1b[2Kwarm start: epoch 8/8 | done\n"
    )


def test_off_a_terminal_a_long_phase_prints_a_line_every_log_period(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    shown = Progress(10, stream=stream, log_period_s=60.0)
    for t, done in [(1030.0, 10), (1061.0, 20), (1100.0, 30), (1125.0, 40)]:
        now[0] = t
        shown.phase_line("held-out", done, 100, f"{t - 1000:.0f} s")
    now[0] = 1130.0
    shown.phase_line("held-out", 100, 100, "done", final=True)
    now[0] = 1180.0  # 50 s after the final line: the period counts from the last line printed
    shown.phase_line("next phase", 1, 100)
    assert stream.getvalue() == "held-out  20/100 | 61 s\nheld-out  40/100 | 125 s\nheld-out 100/100 | done\n"


def test_off_a_terminal_the_status_between_updates_is_logged_as_running():
    async def main() -> str:
        stream = io.StringIO()
        shown = Progress(12, stream=stream, log_period_s=60.0)
        row = {"iteration": 3, "groups_admitted": 40, "groups_cut": 5, "groups_trained": 6}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(shown.tick, lambda: row)
            await trio.sleep(130)
            nursery.cancel_scope.cancel()
        return stream.getvalue()

    clock = trio.testing.MockClock(autojump_threshold=0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(progress_module.time, "monotonic", trio.current_time)
        lines = trio.run(main, clock=clock).splitlines()
    assert len(lines) == 2  # at 60 s and 120 s
    assert all(line.startswith("after update   3/12 | ") for line in lines)


def test_worker_threads_reach_the_display_and_it_does_not_leak_past_the_run():
    stream = io.StringIO()
    shown = Progress(10, stream=stream)

    async def main() -> None:
        shown.activate()
        await trio.to_thread.run_sync(lambda: report("warm start: epoch", 1, 2, final=True))

    trio.run(main)
    report("after the run", 1, 1, final=True)
    assert stream.getvalue() == "warm start: epoch 1/2\n"


def test_a_disabled_display_prints_nothing():
    stream = _Terminal()
    Progress(10, enabled=False, stream=stream).phase_line("x", 1, 1, final=True)
    assert stream.getvalue() == ""


def test_format_phase_aligns_counts_to_the_total():
    assert format_phase("evaluation", 7, 400) == "evaluation   7/400"


def test_the_status_line_says_its_success_rate_leaves_cut_groups_out() -> None:
    row = {"iteration": 3, "success_rate": 0.45, "groups_admitted": 40, "groups_cut": 25, "groups_trained": 8}
    line = format_status(row, 40)
    assert line.startswith("update   3/40 | uncut success   45% | groups admitted   40 cut  25 trained    8")
