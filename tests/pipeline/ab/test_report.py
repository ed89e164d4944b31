import numpy as np
import pytest

from pipeline.ab._markdown import report_markdown
from pipeline.ab._plots import step_values
from pipeline.ab._report import CurvePoint, RunRecord, build_report, curve_from, run_figures, time_to_target


def _summary(wall: float, after: float = 0.5, **extra):
    return {"stop_reason": "updates", "grpo_wall_s": wall, "wall_s": wall + 100, "env_steps": 10 * wall,
            "groups_cut": 1, "groups_trained": 16, "heldout_success_before": 0.3, "heldout_success_after": after,
            "heldout_before": {"heldout_seen": 0.2, "heldout_unseen": 0.4},
            "heldout_after": {"heldout_seen": after, "heldout_unseen": after}, **extra}


def _record(arm, seed, summary, rows=()):
    curve, periodic = curve_from(summary, list(rows))
    return RunRecord(arm, seed, summary, curve, periodic)


def test_curve_is_before_then_periodic_rows_then_after():
    rows = [{"wall_s": 20.0, "heldout/mean": 0.6, "heldout/seen": 0.5, "heldout/unseen": 0.7},
            {"wall_s": 10.0, "heldout/mean": 0.4},
            {"wall_s": 15.0, "success_rate": 0.1}]  # an update row without evaluation
    curve, periodic = curve_from(_summary(30.0, after=0.7), rows)
    assert periodic
    assert [(p.wall_s, p.mean) for p in curve] == [(0.0, 0.3), (10.0, 0.4), (20.0, 0.6), (30.0, 0.7)]
    assert (curve[0].seen, curve[0].unseen) == (0.2, 0.4)
    assert time_to_target(curve, 0.55) == 20.0
    assert time_to_target(curve, 0.9) is None
    assert curve_from(_summary(30.0), [])[1] is False


def test_newer_summary_keys_win_and_absent_ones_are_none():
    figures = run_figures(_record("a", 0, _summary(10.0, **{"gate/precision": 0.9, "gate_precision": 0.1,
                                                          "trajectory_slot_occupancy": 0.8, "slot_occupancy": 0.7})), None)
    assert (figures["gate_precision"], figures["slot_occupancy"]) == (0.9, 0.8)
    assert figures["generated_tokens"] is None and figures["heldout_unseen_before"] == 0.4
    assert "time_to_target_s" not in figures
    assert figures["informative_groups"] is None  # an older summary without the learner's count: not guessed


def test_informative_groups_are_what_the_learner_trained_not_what_was_handed_to_it():
    # The allocator handed 60 groups to the learner (55 with reward variance), 12 of them after the last
    # update; the learner trained 48, 40 of them informative. The report says 40 of 48, not 55 of 48.
    stats = {"allocator_stats": {"allocator/groups_trained": 60, "allocator/groups_trained_zero_variance": 5}}
    summary = _summary(10.0, groups_trained=48, groups_trained_informative=40, **stats)
    figures = run_figures(_record("a", 0, summary), None)
    assert (figures["groups_trained"], figures["informative_groups"]) == (48, 40)


def test_report_pairs_by_seed_and_lists_what_is_missing():
    records = [_record("base", 0, _summary(100.0)), _record("base", 1, _summary(300.0)),
               _record("fast", 0, _summary(80.0, after=0.6)), _record("fast", 1, _summary(240.0, after=0.4))]
    report = build_report(records, arms=["base", "fast"], seeds=[0, 1, 2], baseline="base", resamples=500)
    ratio = report["comparisons"]["fast"]["wall_ratio"]
    assert (ratio["estimate"], ratio["ci_low"], ratio["ci_high"], ratio["n_pairs"]) == pytest.approx((0.8, 0.8, 0.8, 2))
    delta = report["comparisons"]["fast"]["heldout_after_delta"]
    assert delta["estimate"] == pytest.approx(0.0) and delta["ci_low"] == pytest.approx(-0.1)
    arm = report["arms"]["fast"]
    assert arm["n"] == 2 and arm["wall_s"] == pytest.approx(160.0) and arm["per_seed"]["1"]["wall_s"] == 240.0
    assert {"wall_s", "env_steps", "groups_cut", "groups_trained", "heldout_success_after"} <= set(arm)
    assert report["missing"] == [{"arm": "base", "seed": 2}, {"arm": "fast", "seed": 2}]
    assert "base" not in report["comparisons"]
    assert any("periodic" in n for n in report["notes"])


def test_a_run_stopped_by_the_wall_limit_is_flagged():
    records = [_record("base", 0, _summary(100.0)), _record("x", 0, _summary(50.0, stop_reason="max_wall_s"))]
    report = build_report(records, arms=["base", "x"], seeds=[0], baseline="base", resamples=100)
    assert any("x seed 0 stopped by 'max_wall_s'" in n for n in report["notes"])


def test_target_rule_compares_time_to_reach_it():
    rows = [{"wall_s": 40.0, "heldout/mean": 0.6}]
    records = [_record("base", 0, _summary(100.0, stop_reason="target_heldout"), rows),
               _record("x", 0, _summary(50.0, stop_reason="target_heldout"), [{"wall_s": 10.0, "heldout/mean": 0.6}])]
    report = build_report(records, arms=["base", "x"], seeds=[0], baseline="base", target=0.55, resamples=100)
    assert report["comparisons"]["x"]["time_to_target_ratio"]["estimate"] == pytest.approx(0.25)
    assert report["stop_rule"] == {"kind": "target_heldout", "target": 0.55}
    assert not any("stopped by" in n for n in report["notes"])
    text = report_markdown(report, "study")
    assert "Time to held-out success ≥ 55%" in text and "| x | 10.0 | 1/1 | 0.250 [0.250, 0.250] (n=1, range) |" in text


def test_markdown_says_n_a_for_absent_figures():
    records = [_record("base", 0, _summary(100.0)), _record("x", 0, _summary(90.0))]
    text = report_markdown(build_report(records, arms=["base", "x"], seeds=[0], baseline="base", resamples=100), "s")
    assert "| x | 1 | 90.0 | 0.900 [0.900, 0.900] (n=1, range) |" in text
    assert "n/a / n/a" in text  # no gate precision / recall in these summaries


def test_step_values_hold_the_last_measurement():
    curve = [CurvePoint(0.0, 0.1), CurvePoint(10.0, 0.5), CurvePoint(20.0, 0.3)]
    values = step_values(curve, np.array([-1.0, 0.0, 9.9, 10.0, 25.0]))
    assert np.isnan(values[0])
    assert list(values[1:]) == [0.1, 0.1, 0.5, 0.3]
