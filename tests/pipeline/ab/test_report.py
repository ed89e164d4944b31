import json
import math

import pytest

from pipeline.ab._ledger import estimated, recorded
from pipeline.ab._markdown import report_markdown
from pipeline.ab._report import RunRecord, build_report, curve_from, read_run, run_figures
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
    report = build_report(records, arms=["base", "fast"], seeds=[0, 1, 2], baseline="base")
    ratio = report["comparisons"]["fast"]["wall_ratio"]
    assert (ratio["estimate"], ratio["ci_low"], ratio["ci_high"], ratio["n_pairs"]) == pytest.approx((0.8, 0.8, 0.8, 2))
    delta = report["comparisons"]["fast"]["heldout_after_delta"]  # per-seed +0.1, -0.1: Student-t, df 1
    assert delta["estimate"] == pytest.approx(0.0) and delta["ci_low"] == pytest.approx(-12.7062 * 0.1, rel=1e-4)
    arm = report["arms"]["fast"]
    assert arm["n"] == 2 and arm["wall_s"] == pytest.approx(160.0) and arm["per_seed"]["1"]["wall_s"] == 240.0
    assert {"wall_s", "env_steps", "groups_cut", "groups_trained", "heldout_success_after"} <= set(arm)
    assert report["missing"] == [{"arm": "base", "seed": 2}, {"arm": "fast", "seed": 2}]
    assert "base" not in report["comparisons"]
    assert any("periodic" in n for n in report["notes"])
    assert report["resolution"]["fast"]["wall_ratio"] == "no A/A floor"  # excludes 1, but no control arm to say more


def test_the_aa_arm_sets_the_noise_floor_and_an_effect_within_it_is_not_resolved():
    # The A/A arm came out 0.93x the baseline's wall on every seed; `small` 0.95x (inside the floor), `big` 0.8x.
    walls = {0: 100.0, 1: 200.0, 2: 150.0}
    records = [_record(arm, s, _summary(w * f)) for s, w in walls.items()
               for arm, f in (("base", 1.0), ("aa", 0.93), ("small", 0.95), ("big", 0.8))]
    report = build_report(records, arms=["base", "aa", "small", "big"], seeds=[0, 1, 2], baseline="base", aa_arm="aa")
    assert report["noise_floor"]["wall_ratio"] == pytest.approx(-math.log(0.93))
    assert report["resolution"]["small"]["wall_ratio"] == "not resolved"  # its interval excludes 1, the floor swallows it
    assert report["resolution"]["big"]["wall_ratio"] == "resolved"
    assert report["resolution"]["big"]["heldout_after_delta"] == "not resolved"  # no difference at all
    text = report_markdown(report, "s")
    assert "A/A control arm: `aa`" in text and "Noise floor (`aa` against `base`" in text and "wall ×0.930" in text
    assert "| small | 3 | " in text and "0.950 [0.950, 0.950] (n=3) **not resolved**" in text
    assert "A/A: 0.930" in text
    # against another baseline the floor is still the A/A arm's distance from the arm it copies
    other = build_report(records, arms=["base", "aa", "small", "big"], seeds=[0, 1, 2], baseline="big", aa_arm="aa", aa_of="base")
    assert other["noise_floor"]["wall_ratio"] == pytest.approx(-math.log(0.93))
    assert other["resolution"]["base"]["wall_ratio"] == "resolved"  # 1 / 0.8 is beyond the floor
    assert "Noise floor (`aa` against `base`" in report_markdown(other, "s")


def test_degenerate_and_screened_seeds_are_reported_apart_and_never_averaged():
    records = [_record(a, s, _summary(100.0 * (1 + s), learner_updates=24)) for a in ("base", "x") for s in (0, 1)]
    records += [_record(a, 2, _summary(4000.0, learner_updates=0, stop_reason="max_wall_s")) for a in ("base", "x")]
    records += [_record(a, 3, _summary(50.0, learner_updates=24)) for a in ("base", "x")]
    report = build_report(records, arms=["base", "x"], seeds=[0, 1, 2, 3], baseline="base",
                          screened_out={3: "warm start wins 2 % on dev, outside [10 %, 70 %]"})
    assert report["degenerate_seeds"] == [2] and set(report["apart"]) == {"base-s2", "x-s2"}
    assert report["arms"]["base"]["seeds"] == [0, 1] and report["arms"]["base"]["wall_s"] == pytest.approx(150.0)
    assert report["comparisons"]["x"]["wall_ratio"]["seeds"] == [0, 1]
    assert report["missing"] == [] and report["screened_out"] == {"3": "warm start wins 2 % on dev, outside [10 %, 70 %]"}
    text = report_markdown(report, "s")
    assert "## Degenerate seeds, reported apart" in text and "| base-s2 | 4000.0 |" in text
    assert "seed 3: warm start wins 2 % on dev" in text
    assert not any("x seed 2 stopped by" in n for n in report["notes"])  # apart, not a note about a comparable run
    # a seed where one arm learned is no degenerate seed
    one = [*records[:4], _record("base", 2, _summary(4000.0, learner_updates=0)), _record("x", 2, _summary(900.0, learner_updates=24))]
    assert build_report(one, arms=["base", "x"], seeds=[0, 1, 2], baseline="base")["degenerate_seeds"] == []


def test_a_run_stopped_by_the_wall_limit_is_flagged():
    records = [_record("base", 0, _summary(100.0)), _record("x", 0, _summary(50.0, stop_reason="max_wall_s"))]
    report = build_report(records, arms=["base", "x"], seeds=[0], baseline="base")
    assert any("x seed 0 stopped by 'max_wall_s'" in n for n in report["notes"])


def test_target_rule_compares_time_to_reach_it():
    rows = [{"wall_s": 40.0, "heldout/mean": 0.6}]
    records = [_record("base", 0, _summary(100.0, stop_reason="target_heldout"), rows),
               _record("x", 0, _summary(50.0, stop_reason="target_heldout"), [{"wall_s": 10.0, "heldout/mean": 0.6}])]
    report = build_report(records, arms=["base", "x"], seeds=[0], baseline="base", target=0.55)
    ratio = report["comparisons"]["x"]["time_to_target_ratio"]
    assert ratio["estimate"] == pytest.approx(0.25) and ratio["status"] == "ratio"
    assert report["stop_rule"] == {"kind": "target_heldout", "target": 0.55, "stops": True, "horizon_s": 50.0}
    assert not any("stopped by" in n for n in report["notes"])
    text = report_markdown(report, "study")
    assert "Time to held-out success ≥ 55 %" in text and "| x | 1/1 | 10.0 (n=1, no interval) | 0.250 (n=1, no interval) |" in text


def test_every_arm_is_cut_at_the_common_budget_and_a_censored_baseline_gives_no_ratio():
    # Common budget: the shortest run, 100 s. base reaches at 40 s on seed 0, at 150 s (after the budget) on seed 1,
    # never on seed 2. x reaches at 10, 20, 30 s. x's ratio to base is "not reached" (base censored on 2 of 3);
    # base's ratio to x is a number (x reached on every seed).
    def rec(arm, seed, reach_at, wall):
        rows = [{"wall_s": reach_at, "heldout/mean": 0.6}] if reach_at is not None else []
        return _record(arm, seed, _summary(wall), rows)

    records = [rec("base", 0, 40.0, 100.0), rec("base", 1, 150.0, 200.0), rec("base", 2, None, 200.0),
               rec("x", 0, 10.0, 120.0), rec("x", 1, 20.0, 120.0), rec("x", 2, 30.0, 120.0)]
    report = build_report(records, arms=["base", "x"], seeds=[0, 1, 2], baseline="base", target=0.55)
    assert report["stop_rule"]["horizon_s"] == 100.0
    base = report["time_to_target"]["base"]
    assert (base["reached"], base["n"]) == (1, 3) and base["estimate"] == pytest.approx(80.0)  # 40, 100, 100
    assert base["ci_low"] < 80.0 < base["ci_high"]
    assert report["time_to_target"]["x"]["estimate"] == pytest.approx(20.0)
    ratio = report["comparisons"]["x"]["time_to_target_ratio"]
    assert ratio == {"status": "not reached", "baseline_censored": 2, "n_pairs": 3, "censored_seeds": [1, 2]}
    text = report_markdown(report, "s")
    assert "inconclusive (baseline censored on 2 of 3 seeds)" in text and "| base | 1/3 |" in text
    flipped = build_report(records, arms=["base", "x"], seeds=[0, 1, 2], baseline="x", target=0.55)
    back = flipped["comparisons"]["base"]["time_to_target_ratio"]
    assert back["status"] == "lower bound" and back["arm_censored"] == 2
    assert back["estimate"] == pytest.approx((4.0 * 5.0 * (100 / 30)) ** (1 / 3))


def test_env_steps_and_tokens_to_target_are_those_of_the_publication():
    base = [_record("base", s, _summary(100.0, generated_tokens=4000), [{"wall_s": 40.0, "heldout/mean": 0.6,
                                                                          "env_steps": 400, "generated_tokens": 2000}])
            for s in (0, 1)]
    x = [_record("x", 0, _summary(50.0, generated_tokens=3000), [{"wall_s": 10.0, "heldout/mean": 0.6,
                                                                   "env_steps": 200, "generated_tokens": 1000}]),
         _record("x", 1, _summary(60.0, generated_tokens=5000), [{"wall_s": 30.0, "heldout/mean": 0.6,
                                                                   "env_steps": 800, "generated_tokens": 2500}])]
    report = build_report(base + x, arms=["base", "x"], seeds=[0, 1], baseline="base", target=0.55)
    per_seed = report["arms"]["x"]["per_seed"]
    assert (per_seed["0"]["env_steps_to_target"], per_seed["0"]["tokens_to_target"]) == (200, 1000)
    comparisons = report["comparisons"]["x"]
    assert comparisons["env_steps_to_target_ratio"]["estimate"] == pytest.approx(1.0)  # sqrt(0.5 x 2)
    assert comparisons["tokens_to_target_ratio"]["estimate"] == pytest.approx(math.sqrt(0.5 * 1.25))


def test_with_every_wall_clock_left_out_there_is_no_time_to_compare():
    loaded = {"load_1m_mean": 11.0, "cores_available": 2, "other_cpu_cores": 1.4, "machine_loaded": True}
    records = [_record(a, 0, _summary(100.0, **loaded), [{"wall_s": 40.0, "heldout/mean": 0.6}]) for a in ("base", "x")]
    report = build_report(records, arms=["base", "x"], seeds=[0], baseline="base", target=0.55)
    assert report["time_to_target"]["x"]["n"] == 0 and report["comparisons"]["x"]["time_to_target_ratio"]["status"] == "no pairs"
    assert "| x | 0/0 | n/a | n/a | n/a | n/a |" in report_markdown(report, "s")


def test_markdown_says_n_a_for_absent_figures():
    records = [_record("base", 0, _summary(100.0)), _record("x", 0, _summary(90.0))]
    text = report_markdown(build_report(records, arms=["base", "x"], seeds=[0], baseline="base"), "s")
    assert "| x | 1 | 90.0 | 0.900 (n=1, no interval) **not resolved** |" in text
    assert "n/a / n/a" in text  # no gate precision / recall in these summaries


def test_the_ledger_is_read_when_recorded_and_estimated_from_older_records():
    fates = {"trained_informative": {"groups": 4, "env_steps": 600, "tokens": 3000},
             "dropped_all_fail": {"groups": 2, "env_steps": 300, "tokens": 1500},
             "cut": {"groups": 1, "env_steps": 100, "tokens": 500}}
    ledger = {"fates": fates, "env_steps": 1000, "tokens": 5000, "env_steps_per_informative_group": 250.0,
              "tokens_per_informative_group": 1250.0,
              "idle": {"learner_waiting": 0.2, "pacer_holding": 0.1, "slot_occupancy": 0.7}}
    new = _record("base", 0, _summary(100.0, ledger=ledger))
    new = RunRecord(new.arm, new.seed, new.summary, new.curve, new.periodic, recorded(new.summary))
    old_summary = _summary(100.0, env_steps=1000, generated_tokens=5000, items_trained=500, groups_all_fail=2,
                           groups_dropped_zero_variance=3, groups_trained=4, groups_trained_informative=4)
    old = _record("x", 0, old_summary)
    old = RunRecord(old.arm, old.seed, old.summary, old.curve, old.periodic, estimated(old_summary, 4, 30))
    report = build_report([new, old], arms=["base", "x"], seeds=[0], baseline="base")
    base, x = report["arms"]["base"], report["arms"]["x"]
    assert base["ledger"]["estimated"] is False and base["ledger"]["shares"]["cut"] == pytest.approx(0.1)
    assert base["env_steps_per_informative_group"] == 250.0
    assert x["ledger"]["estimated"] is True
    assert x["ledger"]["fates"]["dropped_all_fail"]["env_steps"] == 240.0  # 2 groups x 4 x 30 steps
    assert x["ledger"]["fates"]["trained_informative"]["env_steps"] == 500.0
    assert sum(f["env_steps"] for f in x["ledger"]["fates"].values()) == 1000.0
    assert x["env_steps_per_informative_group"] == 250.0
    # zero-advantage items not kept (the tiny budget): the trained all-fail groups' steps are not in items_trained
    tiny = estimated({"env_steps": 128, "items_trained": 0, "groups_trained": 4, "groups_trained_informative": 0,
                      "groups_all_fail": 4, "groups_dropped_zero_variance": 0}, 4, 8, zero_items_counted=False)
    assert tiny["fates"]["trained_zero_variance"]["env_steps"] == 128.0 and tiny["fates"]["other (not separable)"]["env_steps"] == 0.0
    text = report_markdown(report, "s")
    assert "## Where decoder work went" in text and "| x (estimated) |" in text and "20.0 % / 10.0 % / 70.0 %" in text


def test_machines_commits_and_order_are_in_the_report(tmp_path):
    for arm, machine in (("base", "m-one"), ("x", "m-two")):
        folder = tmp_path / f"{arm}-s0"
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps(_summary(100.0)))  # commits.jsonl: what pipeline/provenance.py writes
        lines = [{"commit": "abc123", "dirty": arm == "x", "resumed": False}]
        if arm == "base":  # resumed at another commit: both named, oldest first
            lines.append({"commit": "def456", "dirty": False, "resumed": True})
        (folder / "commits.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        (folder / "machine.json").write_text(json.dumps({"machine_id": machine, "boot_id": "b"}))
        (folder / "config.toml").write_text("[rollout]\ngroup_size = 4\n[env]\nmax_steps = 30\n")
    records = [read_run(a, 0, tmp_path / f"{a}-s0") for a in ("base", "x")]
    report = build_report(records, arms=["base", "x"], seeds=[0], baseline="base", order={0: ["x", "base"]})
    assert report["machines"]["spans_machines"] is True and report["commits"] == {"base-s0": "abc123, def456", "x-s0": "abc123+dirty"}
    text = report_markdown(report, "s")
    assert "This study spans 2 machines" in text and "`abc123+dirty` (1 run)" in text and "0: x, base" in text


def test_a_loaded_run_is_flagged_and_its_wall_clock_left_out_of_wall_ratios_unless_kept():
    idle = {"load_1m_mean": 1.2, "cores_available": 2, "other_cpu_cores": 0.05, "machine_loaded": False}
    loaded = {"load_1m_mean": 11.0, "cores_available": 2, "other_cpu_cores": 1.4, "machine_loaded": True}
    records = [_record("base", 0, _summary(100.0, **loaded)), _record("base", 1, _summary(200.0, **idle)),
               _record("x", 0, _summary(50.0, **idle)), _record("x", 1, _summary(160.0, **idle))]
    report = build_report(records, arms=["base", "x"], seeds=[0, 1], baseline="base")
    wall, steps = report["comparisons"]["x"]["wall_ratio"], report["comparisons"]["x"]["env_steps_ratio"]
    assert (wall["estimate"], wall["seeds"]) == (pytest.approx(0.8), [1])  # seed 0's pair is out: its baseline ran loaded
    assert steps["seeds"] == [0, 1]  # env steps stay in
    assert report["arms"]["base"]["wall_s"] == 200.0 and report["loaded_runs"] == [{"arm": "base", "seed": 0}]
    text = report_markdown(report, "s")
    assert "| base | 2 (1 loaded) |" in text
    assert any("base seed 0 ran on a loaded machine (mean 1-minute load 11.00 on 2 cores" in n and "left out" in n
               for n in report["notes"])
    kept = build_report(records, arms=["base", "x"], seeds=[0, 1], baseline="base", keep_loaded_wall=True)
    assert kept["comparisons"]["x"]["wall_ratio"]["seeds"] == [0, 1] and kept["arms"]["base"]["wall_s"] == 150.0
