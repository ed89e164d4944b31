import numpy as np
import pytest

from pipeline.ab._markdown import report_markdown
from pipeline.ab._plots import step_values, write_plots
from pipeline.ab._report import CurvePoint

_REPORT = {"baseline": "a", "comparisons": {}, "intervals": {"level": 0.95}}


def _curve(*points: tuple[float, float]) -> list[CurvePoint]:
    return [CurvePoint(t, v) for t, v in points]


def test_step_values_hold_the_last_measurement():
    curve = [CurvePoint(0.0, 0.1), CurvePoint(10.0, 0.5), CurvePoint(20.0, 0.3)]
    values = step_values(curve, np.array([-1.0, 0.0, 9.9, 10.0, 25.0]))
    assert np.isnan(values[0])
    assert list(values[1:]) == [0.1, 0.1, 0.5, 0.3]


def test_a_panel_per_seed_once_there_are_two_seeds(tmp_path):
    pytest.importorskip("matplotlib")
    one = {"a": {0: _curve((0, 0.2), (10, 0.4))}, "b": {0: _curve((0, 0.2), (12, 0.3))}}
    assert write_plots(tmp_path, one, _REPORT) == ["curves.png"]
    assert not (tmp_path / "curves_by_seed.png").exists()

    # four seeds: two rows of panels; an arm may lack a seed (its run unfinished), a seed's curve may be empty
    four = {"a": {s: _curve((0, 0.1 * s), (10, 0.1 * s + 0.1)) for s in range(4)}, "b": {0: _curve((0, 0.2)), 3: []}}
    assert write_plots(tmp_path, four, _REPORT) == ["curves.png", "curves_by_seed.png"]
    assert (tmp_path / "curves_by_seed.png").stat().st_size > 0


def test_no_curves_no_curve_plots(tmp_path):
    pytest.importorskip("matplotlib")
    assert write_plots(tmp_path, {"a": {0: []}, "b": {}}, _REPORT) == []


def test_the_report_names_only_the_plots_written():
    report = {"baseline": "a", "arms": {}, "comparisons": {}, "notes": [], "missing": [], "stop_rule": {"kind": "budget"},
              "heldout_range": "test", "curve_range": "valid", "wall_clock": "GRPO phase",
              "intervals": {"level": 0.95}}
    assert "Plots:" not in report_markdown(report | {"plots": []}, "s")  # no matplotlib: the notes say so instead
    text = report_markdown(report | {"plots": ["curves.png", "curves_by_seed.png"]}, "s")
    assert "`curves_by_seed.png` (the same, one panel per seed)" in text
    assert "wall_ratio.png" not in text
