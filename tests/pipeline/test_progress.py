import io

import trio

from pipeline import progress as progress_module
from pipeline.progress import Progress, format_phase, format_status, report


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_report_without_an_active_display_does_nothing():
    report("warm start", 1, 8, "loss 0.5", final=True)  # no display: no error, nothing to see


def test_off_a_terminal_only_final_reports_print_a_line():
    stream = io.StringIO()
    shown = Progress(10, stream=stream)

    async def main() -> None:
        shown.activate()
        report("held-out heldout_seen", 3, 200, "12 s")
        report("held-out heldout_seen", 200, 200, "success 25.0%", final=True)

    trio.run(main)
    assert stream.getvalue() == "held-out heldout_seen 200/200 | success 25.0%\n"


def test_on_a_terminal_reports_refresh_one_line_in_place(monkeypatch):
    clock = iter([100.0, 100.1, 100.5, 100.6])  # the second refresh comes too soon and is skipped
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
