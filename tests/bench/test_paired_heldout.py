"""bench/paired_heldout.py pairs two held-out measures by task: a run's before / after, or a warm start's
`run.py pretrain --episodes` file against a run's after; a file that cannot be read is one clear error."""

from __future__ import annotations

import json

import pytest

from . import bench_module


def _tool():
    return bench_module("paired_heldout")


def _rows(won: list[bool], family: str = "pick", start: int = 0) -> list[list[object]]:
    return [[f"t{start + i}", family, w, 5] for i, w in enumerate(won)]


def test_a_warm_start_file_pairs_by_task_with_a_run_s_after(tmp_path, capsys) -> None:
    warm = tmp_path / "warm.json"  # what `run.py pretrain --episodes` writes: one measure, as `before`
    warm.write_text(json.dumps({"range": "valid", "before": {"seen": _rows([False, False, True, False]) + _rows([True, True], "look", 4)}}))
    run = tmp_path / "heldout_episodes.json"  # the same tasks in another order, one task (t9) the warm start never played
    after = _rows([True, True, True, False]) + _rows([False, True], "look", 4) + _rows([True], "look", 9)
    run.write_text(json.dumps({"range": "valid", "before": {}, "after": {"seen": after[::-1]}}))
    assert _tool().main(["--before", str(warm), "--after", str(run)]) == 0
    out = capsys.readouterr().out
    # six tasks on both sides: +2 (t0, t1), -1 (t4): +1/6 of a task each
    assert "range valid: +16.7 points" in out and "over 6 tasks (2 won only after, 1 only before)" in out
    assert "| look | 2 | 2 | 1 | -50.0 [" in out and "| pick | 4 | 1 | 3 | +50.0 [" in out


def test_a_run_s_own_measures_are_read_by_key(tmp_path, capsys) -> None:
    run = tmp_path / "heldout_episodes.json"
    run.write_text(json.dumps({"range": "dev", "before": {"seen": _rows([False, True])}, "after": {"seen": _rows([True, True])}}))
    assert _tool().main(["--before", f"{run}:after", "--after", str(run)]) == 0
    assert "+0.0 points" in capsys.readouterr().out  # after against itself
    assert _tool().main(["--before", str(run), "--after", str(tmp_path)]) == 0  # a run folder: its heldout_episodes.json
    assert "+50.0 points" in capsys.readouterr().out


@pytest.mark.parametrize(("content", "message"), [
    (None, "No such file"),
    ("{not json", "not JSON"),
    (json.dumps({"range": "dev", "before": {"seen": []}}), "no `after` measure (it holds: before)"),
])
def test_an_unreadable_side_is_one_clear_error(tmp_path, capsys, content, message) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"range": "dev", "before": {"seen": _rows([True])}}))
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    assert _tool().main(["--before", str(good), "--after", str(bad)]) == 2
    assert message in capsys.readouterr().err


def test_two_measures_without_a_common_task_are_refused(tmp_path, capsys) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"range": "dev", "before": {"seen": _rows([True])}}))
    b.write_text(json.dumps({"range": "valid", "after": {"seen": _rows([True], start=50)}}))
    assert _tool().main(["--before", str(a), "--after", str(b)]) == 2
    assert "no task measured on both sides (ranges 'dev' and 'valid')" in capsys.readouterr().err
