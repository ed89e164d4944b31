import pytest

from pipeline.ab._markdown import report_markdown
from pipeline.ab._report import RunRecord, build_report, curve_from, run_figures
from pipeline.ab._timing import TimeToTarget, time_to_target


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
    assert [p.periodic for p in curve] == [False, True, True, False]
    assert time_to_target(curve, 0.55, 30.0) == TimeToTarget(20.0, True)  # these rows carry no env steps or tokens
    assert time_to_target(curve, 0.65, 30.0, 300.0, 900.0) == TimeToTarget(30.0, False, 300.0, 900.0)  # the after measure (another range) does not count
    assert time_to_target(curve, 0.9, None) is None
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
    assert report["stop_rule"] == {"kind": "target_heldout", "target": 0.55, "stops": True}
    assert not any("stopped by" in n for n in report["notes"])
    text = report_markdown(report, "study")
    assert "Time to held-out success ≥ 55%" in text and "| x | 10.0 | 1/1 | 0 | 0.250 [0.250, 0.250] (n=1, range) |" in text


def test_env_steps_and_tokens_to_target_are_those_of_the_publication_and_censored_at_the_totals():
    # Seed 0 of `x` reached the target with weights published after 200 env steps and 1,000 tokens; seed 1 never
    # did: it counts at its totals (summary env_steps = 10 x wall, generated_tokens), as its time counts at its budget.
    base = [_record("base", s, _summary(100.0, generated_tokens=4000), [{"wall_s": 40.0, "heldout/mean": 0.6,
                                                                          "env_steps": 400, "generated_tokens": 2000}])
            for s in (0, 1)]
    x = [_record("x", 0, _summary(50.0, generated_tokens=3000), [{"wall_s": 10.0, "heldout/mean": 0.6,
                                                                   "env_steps": 200, "generated_tokens": 1000}]),
         _record("x", 1, _summary(60.0, generated_tokens=5000), [{"wall_s": 30.0, "heldout/mean": 0.5,
                                                                   "env_steps": 300, "generated_tokens": 2500}])]
    report = build_report(base + x, arms=["base", "x"], seeds=[0, 1], baseline="base", target=0.55, resamples=100)
    per_seed = report["arms"]["x"]["per_seed"]
    assert (per_seed["0"]["env_steps_to_target"], per_seed["0"]["tokens_to_target"]) == (200, 1000)
    assert (per_seed["1"]["env_steps_to_target"], per_seed["1"]["tokens_to_target"]) == (600.0, 5000)  # censored
    comparisons = report["comparisons"]["x"]
    assert comparisons["env_steps_to_target_ratio"]["estimate"] == pytest.approx(400.0 / 400.0)
    assert comparisons["tokens_to_target_ratio"]["estimate"] == pytest.approx(3000.0 / 2000.0)
    assert "| 400 | 1.000 [0.500, 1.500] (n=2, range) | 3000 | 1.500 [0.500, 2.500] (n=2, range) |" in report_markdown(report, "s")


def test_markdown_says_n_a_for_absent_figures():
    records = [_record("base", 0, _summary(100.0)), _record("x", 0, _summary(90.0))]
    text = report_markdown(build_report(records, arms=["base", "x"], seeds=[0], baseline="base", resamples=100), "s")
    assert "| x | 1 | 90.0 | 0.900 [0.900, 0.900] (n=1, range) |" in text
    assert "n/a / n/a" in text  # no gate precision / recall in these summaries


def test_time_to_target_is_the_publish_stamp_and_an_unreached_seed_is_censored_at_its_budget():
    # Rows are stamped when their weights were published (pipeline/run/heldout.py): seed 0 of `x` got there at 10 s.
    # Seed 1 of `x` never did in its 300 s: it counts at 300 s, is counted as censored, and the ratio holds it.
    base = [_record("base", s, _summary(100.0, stop_reason="target_heldout"), [{"wall_s": 40.0, "heldout/mean": 0.6}]) for s in (0, 1)]
    x = [_record("x", 0, _summary(50.0, stop_reason="target_heldout"), [{"wall_s": 10.0, "heldout/mean": 0.6}]),
         _record("x", 1, _summary(300.0, after=0.9), [{"wall_s": 100.0, "heldout/mean": 0.5}])]
    report = build_report(base + x, arms=["base", "x"], seeds=[0, 1], baseline="base", target=0.55, resamples=100)
    per_seed = report["arms"]["x"]["per_seed"]
    assert (per_seed["0"]["time_to_target_s"], per_seed["0"]["target_reached"]) == (10.0, 1.0)
    assert (per_seed["1"]["time_to_target_s"], per_seed["1"]["target_reached"]) == (300.0, 0.0)  # after = 0.9 is not the curve
    assert report["comparisons"]["x"]["time_to_target_ratio"]["estimate"] == pytest.approx(155.0 / 40.0)
    assert "| x | 155.0 | 1/2 | 1 |" in report_markdown(report, "s")


def test_a_loaded_run_is_flagged_and_its_wall_clock_left_out_of_wall_ratios_unless_kept():
    idle = {"load_1m_mean": 1.2, "cores_available": 2, "other_cpu_cores": 0.05, "machine_loaded": False}
    loaded = {"load_1m_mean": 11.0, "cores_available": 2, "other_cpu_cores": 1.4, "machine_loaded": True}
    records = [_record("base", 0, _summary(100.0, **loaded)), _record("base", 1, _summary(200.0, **idle)),
               _record("x", 0, _summary(50.0, **idle)), _record("x", 1, _summary(160.0, **idle))]
    report = build_report(records, arms=["base", "x"], seeds=[0, 1], baseline="base", resamples=100)
    wall, steps = report["comparisons"]["x"]["wall_ratio"], report["comparisons"]["x"]["env_steps_ratio"]
    assert (wall["estimate"], wall["seeds"]) == (pytest.approx(0.8), [1])  # seed 0's pair is out: its baseline ran loaded
    assert steps["seeds"] == [0, 1]  # env steps stay in
    assert report["arms"]["base"]["wall_s"] == 200.0 and report["loaded_runs"] == [{"arm": "base", "seed": 0}]
    text = report_markdown(report, "s")
    assert "| base | 2 (1 loaded) |" in text
    assert any("base seed 0 ran on a loaded machine (mean 1-minute load 11.00 on 2 cores" in n and "left out" in n
               for n in report["notes"])
    kept = build_report(records, arms=["base", "x"], seeds=[0, 1], baseline="base", resamples=100, keep_loaded_wall=True)
    assert kept["comparisons"]["x"]["wall_ratio"]["seeds"] == [0, 1] and kept["arms"]["base"]["wall_s"] == 150.0
