"""The harness end to end with a fake `run.py` (a script that writes a run folder at once): order,
resume, unfinished folders, failures, changed configs. The real pipeline runs in test_run_ab_integration."""

import json
import math
import sys
import textwrap

import pytest

from pipeline.ab import main, write_report
from pipeline.ab._control import screen_seeds
from pipeline.ab._presets import find_presets
from pipeline.ab._runner import interleave, plan_study, warm_start_success
from pipeline.config import load_config

FAKE_RUN = textwrap.dedent('''
    import json, os, sys, tomllib
    from pathlib import Path
    if sys.argv[1] == "curve":  # run.py curve FOLDER: the held-out curve measured after the run
        folder = Path(sys.argv[2])
        with open(os.environ["AB_ORDER_LOG"], "a") as f:
            f.write("curve:" + folder.name + "\\n")
        row = {"iteration": 3, "wall_s": 4.0, "env_steps": 40, "heldout/mean": 0.6, "measured": "after the run"}
        (folder / "heldout_curve.jsonl").write_text(json.dumps(row) + "\\n")
        sys.exit(0)
    config = Path(sys.argv[sys.argv.index("--config") + 1])
    cfg = tomllib.loads(config.read_text())
    name, seed = cfg["run"]["name"], cfg["run"]["seed"]
    if "pretrain" in sys.argv:  # the screening measure: AB_WARM "seed:success,..."
        warm = dict(item.split(":") for item in os.environ.get("AB_WARM", "").split(",") if item)
        assert cfg["eval"]["range"] == "dev" and cfg["eval"]["tasks"] <= cfg["eval"]["ranges"]["dev"]
        print(f"heldout_seen: success {100 * float(warm[str(seed)]):.1f}% over 4 tasks of the dev range ()")
        print(f"heldout_unseen: success {100 * float(warm[str(seed)]):.1f}% over 4 tasks of the dev range ()")
        sys.exit(0)
    with open(os.environ["AB_ORDER_LOG"], "a") as f:
        f.write(name + "\\n")
    folder = Path(cfg["run"]["out"]) / name
    folder.mkdir()
    (folder / "config.toml").write_text(config.read_text())
    if name in os.environ.get("AB_FAIL", "").split(","):
        sys.exit(3)
    fast = 0.5 if cfg["gate"]["enabled"] else 1.0
    loaded = dict(item.split(":") for item in os.environ.get("AB_LOADED", "").split(",") if item)  # name: times
    times = Path(os.environ["AB_ORDER_LOG"]).read_text().split().count(name)
    rows = [{"iteration": 1, "wall_s": 5.0, "heldout/mean": 0.5, "heldout/seen": 0.5, "heldout/unseen": 0.5}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    if cfg["eval"].get("curve_off_clock"):  # it keeps version 3's weights and measures them itself, once its clock stops
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "policy-v3.pt").write_bytes(b"")
        if name not in os.environ.get("AB_NO_CURVE", "").split(","):  # else it stopped before its curve
            row = {"iteration": 3, "wall_s": 4.0, "env_steps": 40, "heldout/mean": 0.6, "measured": "after the run"}
            (folder / "heldout_curve.jsonl").write_text(json.dumps(row) + "\\n")
    (folder / "summary.json").write_text(json.dumps({
        "stop_reason": "updates", "grpo_wall_s": 10.0 * (1 + seed) * fast, "wall_s": 20.0, "env_steps": 100,
        "groups_cut": 0, "groups_trained": 8, "heldout_success_before": 0.25, "heldout_success_after": 0.5,
        "machine_loaded": times <= int(loaded.get(name, 0)), "load_1m_mean": 3.0, "cores_available": 2,
        "heldout_before": {"heldout_seen": 0.25, "heldout_unseen": 0.25},
        "heldout_after": {"heldout_seen": 0.5, "heldout_unseen": 0.5}}))
''')


def _load(path, overrides):
    return load_config(path, overrides)


@pytest.fixture
def study(tmp_path, monkeypatch):
    configs = tmp_path / "configs"
    (configs / "arms").mkdir(parents=True)
    (configs / "budgets").mkdir()
    (configs / "arms" / "plain.toml").write_text("# no gate\n[gate]\nenabled = false\n")
    (configs / "arms" / "gated.toml").write_text("# gate\n[gate]\nenabled = true\n")
    (configs / "budgets" / "small.toml").write_text("# small\n[run]\nupdates = 1\n")
    fake = tmp_path / "fake_run.py"
    fake.write_text(FAKE_RUN)
    order = tmp_path / "order.log"
    monkeypatch.setenv("AB_ORDER_LOG", str(order))

    def run(*extra: str) -> int:
        argv = ["--arms", "plain,gated", "--seeds", "0,1", "--budget", "small", "--out", str(tmp_path / "runs"), *extra]
        return main(argv, load=_load, command=[sys.executable, str(fake)], configs=configs)

    def ran() -> list[str]:
        names = order.read_text().split() if order.exists() else []
        order.write_text("")
        return names

    return run, ran, tmp_path / "runs" / "ab-small" / "ab"


def test_interleave_is_seed_major_and_rotates_the_arms_per_seed():
    assert interleave(["a", "b"], [0, 1]) == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    # a cyclic Latin square: over three seeds every arm runs first, second and third once
    order = interleave(["a", "b", "c"], [5, 6, 7])
    positions = {arm: sorted(i % 3 for i, (a, _s) in enumerate(order) if a == arm) for arm in "abc"}
    assert positions == {"a": [0, 1, 2], "b": [0, 1, 2], "c": [0, 1, 2]}


def test_runs_interleaved_then_resumes_without_rerunning(study):
    run, ran, ab_dir = study
    assert run() == 0
    assert ran() == ["plain-s0", "plain-aa-s0", "gated-s0", "plain-aa-s1", "gated-s1", "plain-s1"]
    report = json.loads((ab_dir / "report.json").read_text())
    assert report["baseline"] == "plain" and report["aa_arm"] == "plain-aa"
    plan = json.loads((ab_dir / "plan.json").read_text())
    assert plan["order"] == {"0": ["plain", "plain-aa", "gated"], "1": ["plain-aa", "gated", "plain"]}
    assert report["order"] == plan["order"] and plan["aa_arm"] == "plain-aa"
    assert report["noise_floor"]["wall_ratio"] == pytest.approx(0.0)  # the fake run's A/A arm is the baseline exactly
    assert report["resolution"]["gated"]["wall_ratio"] == "resolved" and "plain-aa" not in report["resolution"]
    assert "A/A control arm: `plain-aa`" in (ab_dir / "report.md").read_text()
    assert report["comparisons"]["gated"]["wall_ratio"]["estimate"] == pytest.approx(0.5)
    assert report["comparisons"]["gated"]["wall_ratio"]["seeds"] == [0, 1]
    assert report["missing"] == []
    assert {"report.md", "curves.png", "curves_by_seed.png", "wall_ratio.png", "plan.json"} <= {p.name for p in ab_dir.iterdir()}

    assert run() == 0
    assert ran() == []  # every arm x seed has its summary.json


def test_the_plots_are_drawn_once_when_the_study_ends_not_after_every_run(study, monkeypatch):
    import pipeline.ab._cli as cli

    run, ran, ab_dir = study
    drawn, write_plots = [], cli.write_plots
    reports = []
    write_report = cli.write_report

    def spy_report(*args, **kwargs):
        report = write_report(*args, **kwargs)
        reports.append(report)
        return report

    monkeypatch.setattr(cli, "write_plots", lambda *a: drawn.append(1) or write_plots(*a))
    monkeypatch.setattr(cli, "write_report", spy_report)
    assert run() == 0 and len(ran()) == 6
    assert len(drawn) == 1 and len(reports) == 7  # a report after each of the 6 runs, the plots once at the end
    assert "plots: drawn when the study ends" in " ".join(reports[0]["notes"]) and reports[-1]["plots"]
    assert run() == 0 and len(drawn) == 2  # a resumed study with nothing left to run still ends with its report


def test_each_run_ends_with_the_time_left_at_this_pace(study, capsys):
    from pipeline.ab._cli import time_left

    assert time_left([600.0, 900.0], 4) == "4 run(s) left, about 0 h 50 min at this pace (a redone or loaded run adds one)"
    assert time_left([3000.0], 2).startswith("2 run(s) left, about 1 h 40 min") and time_left([1.0], 0) == "no run left"
    run, ran, ab_dir = study
    assert run() == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if " left" in line and line.startswith("    ")]
    assert [line.split(",")[0] for line in lines] == [f"{n} run(s) left" for n in range(5, 0, -1)] + ["no run left"]


STOPPABLE_RUN = textwrap.dedent('''
    import os, signal, sys
    from pathlib import Path

    def stopped(*_):
        Path(os.environ["AB_STOPPED"]).write_text("SIGINT")
        sys.exit(130)

    signal.signal(signal.SIGINT, stopped)
    os.kill(os.getppid(), signal.SIGTERM)  # the harness is stopped as this run begins
    signal.pause()
''')


def test_sigterm_stops_the_study_and_the_run_under_way(study, tmp_path, monkeypatch, capsys):
    """SIGTERM to `run.py ab` (a study in the background, SIGINT ignored) once left the run under way going on as an
    orphan: it stops as Ctrl-C stops it, the run told to stop (SIGINT), the report written, exit 130."""
    import signal

    from pipeline.ab._cli import main as ab_main

    run, ran, ab_dir = study
    fake = tmp_path / "stoppable_run.py"
    fake.write_text(STOPPABLE_RUN)
    monkeypatch.setenv("AB_STOPPED", str(tmp_path / "stopped"))
    before = signal.getsignal(signal.SIGTERM)
    argv = ["--arms", "plain,gated", "--seeds", "0", "--budget", "small", "--out", str(tmp_path / "runs")]
    assert ab_main(argv, load=_load, command=[sys.executable, str(fake)], configs=tmp_path / "configs") == 130
    assert (tmp_path / "stopped").read_text() == "SIGINT"
    assert "interrupted; finished runs are kept" in capsys.readouterr().err
    assert (ab_dir / "report.md").exists() and signal.getsignal(signal.SIGTERM) == before


def test_an_unfinished_run_is_set_aside_and_rerun_alone(study):
    run, ran, ab_dir = study
    assert run() == 0
    ran()
    (ab_dir / "gated-s1" / "summary.json").unlink()  # as if killed before the end
    assert run() == 0
    assert ran() == ["gated-s1"]
    assert (ab_dir / "gated-s1.unfinished-1" / "config.toml").exists()
    assert (ab_dir / "gated-s1" / "summary.json").exists()


def test_an_interrupted_run_that_wrote_its_summary_is_rerun_and_left_out_of_the_report(study):
    """A run stopped by SIGTERM or Ctrl-C writes a summary.json too (stop_reason "interrupted"): a study paused
    as a run began must run it again, not keep it as finished."""
    run, ran, ab_dir = study
    assert run() == 0
    ran()
    summary = ab_dir / "gated-s1" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "stop_reason": "interrupted"}))
    assert "gated-s1" in {f"{m['arm']}-s{m['seed']}" for m in write_report(ab_dir)["missing"]}
    assert run() == 0
    assert ran() == ["gated-s1"]
    assert (ab_dir / "gated-s1.unfinished-1" / "summary.json").exists()
    assert json.loads(summary.read_text())["stop_reason"] == "updates"
    assert json.loads((ab_dir / "report.json").read_text())["missing"] == []


def test_a_run_the_load_flagged_is_redone_at_most_n_times_and_set_aside(study, monkeypatch, capsys):
    run, ran, ab_dir = study
    monkeypatch.setenv("AB_LOADED", "plain-s0:1,gated-s1:5")  # plain-s0 loaded once; gated-s1 every time
    assert run("--redo-loaded", "2") == 0
    assert ran() == ["plain-s0", "plain-s0", "plain-aa-s0", "gated-s0", "plain-aa-s1", "gated-s1", "gated-s1", "gated-s1", "plain-s1"]
    assert sorted(p.name for p in ab_dir.glob("*.loaded-*")) == ["gated-s1.loaded-1", "gated-s1.loaded-2", "plain-s0.loaded-1"]
    report = json.loads((ab_dir / "report.json").read_text())
    assert report["loaded_runs_set_aside"] == ["gated-s1.loaded-1", "gated-s1.loaded-2", "plain-s0.loaded-1"]
    assert report["loaded_runs"] == [{"arm": "gated", "seed": 1}]  # still loaded after two reruns: kept, flagged
    assert "running it again" in capsys.readouterr().out
    assert run("--redo-loaded", "2") == 0
    assert ran() == []  # resuming redoes nothing more


def test_without_redo_a_loaded_run_is_kept(study, monkeypatch):
    run, ran, ab_dir = study
    monkeypatch.setenv("AB_LOADED", "plain-s0:1")
    assert run() == 0
    assert ran() == ["plain-s0", "plain-aa-s0", "gated-s0", "plain-aa-s1", "gated-s1", "plain-s1"]
    assert not list(ab_dir.glob("*.loaded-*"))
    assert run("--redo-loaded", "1") == 0  # asked later: the study redoes it on resuming
    assert ran() == ["plain-s0"]


def test_a_failed_run_does_not_stop_the_others(study, monkeypatch):
    run, ran, ab_dir = study
    monkeypatch.setenv("AB_FAIL", "plain-s0")
    assert run() == 1
    assert ran() == ["plain-s0", "plain-aa-s0", "gated-s0", "plain-aa-s1", "gated-s1", "plain-s1"]
    report = json.loads((ab_dir / "report.json").read_text())
    assert report["missing"] == [{"arm": "plain", "seed": 0}]
    assert report["comparisons"]["gated"]["wall_ratio"]["seeds"] == [1]  # pairs only where both finished


def test_a_changed_config_refuses_to_mix_runs(study, capsys):
    run, ran, ab_dir = study
    assert run() == 0
    ran()
    assert run("--set", "run.updates=2") == 2
    assert ran() == []
    assert "was run with another config" in capsys.readouterr().err


def test_bad_usage_runs_nothing_and_lists_every_problem(study, capsys):
    run, ran, ab_dir = study
    assert run("--arms", "plain,nope", "--set", "run.seed=4") == 2
    assert "arm 'nope'" in capsys.readouterr().err
    assert run("--set", "run.seed=4", "--set", "gate.tau=-1", "--baseline", "zzz") == 2
    err = capsys.readouterr().err
    assert "run.seed=4: the harness sets this itself" in err
    assert "arm plain: gate.tau must be >= 0" in err and "arm gated: gate.tau must be >= 0" in err
    assert "baseline 'zzz'" in err
    assert run("--aa-arm", "nope") == 2 and "--aa-arm 'nope' is not one of the arms" in capsys.readouterr().err
    assert run("--seeds", "0,x") == 2
    assert ran() == [] and not ab_dir.exists()


def test_plan_merges_budget_then_arm_then_user(tmp_path):
    (tmp_path / "b.toml").write_text("[gate]\nk = 3\ntau = 0.1\n")
    (tmp_path / "a.toml").write_text("[gate]\ntau = 0.2\n")
    budget, arm = find_presets([str(tmp_path / "b.toml"), str(tmp_path / "a.toml")], tmp_path, "preset")
    study = plan_study(_load, None, budget, [arm], [5], ["gate.k=4"], tmp_path / "ab", "a")
    (tmp_path / "resolved.toml").write_text(study.runs[0].config_toml)
    resolved = load_config(tmp_path / "resolved.toml", [])
    assert (resolved.gate.k, resolved.gate.tau, resolved.run.seed, resolved.run.progress) == (4, 0.2, 5, False)
    assert resolved.run.name == "a-s5" and resolved.run.out == str(tmp_path / "ab")


def test_target_rule_sets_the_stop_and_compares_time_to_reach_it(study, capsys):
    run, ran, ab_dir = study
    assert run("--target-heldout", "0.5", "--eval-every", "3") == 0
    assert len(ran()) == 6
    cfg = load_config(ab_dir / "configs" / "gated-s1.toml", [])
    assert (cfg.run.target_heldout, cfg.eval.every) == (0.5, 3)
    report = json.loads((ab_dir / "report.json").read_text())
    assert report["stop_rule"] == {"kind": "target_heldout", "target": 0.5, "stops": True, "horizon_s": 5.0}
    assert report["comparisons"]["gated"]["time_to_target_ratio"]["estimate"] == pytest.approx(1.0)  # both at 5 s
    assert run("--name", "other", "--target-heldout", "1.5") == 2
    assert "run.target_heldout must be in [0, 1]" in capsys.readouterr().err


def test_to_budget_reads_the_target_off_the_curve_and_lets_every_run_finish_its_budget(study, capsys):
    run, ran, ab_dir = study
    assert run("--target-heldout", "0.5", "--eval-every", "3", "--to-budget") == 0
    cfg = load_config(ab_dir / "configs" / "gated-s1.toml", [])
    # no stop, no measure on the run's clock: it keeps its weights every 3 updates and measures them once its clock stops
    assert (cfg.run.target_heldout, cfg.eval.every, cfg.run.keep_weights_every, cfg.eval.curve_off_clock) == (0.0, 0, 3, True)
    assert len(ran()) == 6  # six runs, and no `run.py curve` process: each run's curve is complete
    report = json.loads((ab_dir / "report.json").read_text())
    assert report["arms"]["gated"]["per_seed"]["1"]["time_to_target_s"] == 4.0  # read off the off-clock curve
    assert report["stop_rule"] == {"kind": "target_heldout", "target": 0.5, "stops": False, "horizon_s": 5.0}
    assert report["comparisons"]["gated"]["time_to_target_ratio"]["estimate"] == pytest.approx(1.0)
    assert "went on to its budget" in (ab_dir / "report.md").read_text()
    assert run("--name", "bad", "--to-budget") == 2
    assert run("--name", "bad2", "--target-heldout", "1.5", "--to-budget") == 2
    err = capsys.readouterr().err
    assert "--to-budget is for --target-heldout" in err and "run.target_heldout must be in [0, 1]" in err


def test_run_py_curve_runs_only_for_a_run_whose_curve_misses_a_kept_version(study, monkeypatch):
    run, ran, ab_dir = study
    monkeypatch.setenv("AB_NO_CURVE", "gated-s1")  # it wrote its summary, then stopped before measuring its curve
    assert run("--target-heldout", "0.5", "--eval-every", "3", "--to-budget") == 0
    order = ran()
    assert [n for n in order if n.startswith("curve:")] == ["curve:gated-s1"]
    assert order[order.index("gated-s1") + 1] == "curve:gated-s1"  # right after its run, before the next run starts
    (ab_dir / "gated-s0" / "heldout_curve.jsonl").unlink()  # a finished run's curve lost: measured when the study resumes
    assert run("--target-heldout", "0.5", "--eval-every", "3", "--to-budget") == 0
    assert ran() == ["curve:gated-s0"]
    assert run("--target-heldout", "0.5", "--eval-every", "3", "--to-budget") == 0
    assert ran() == []  # every curve complete: nothing started


def test_a_study_begun_before_the_run_measured_its_own_curve_resumes(study):
    run, ran, ab_dir = study
    assert run("--target-heldout", "0.5", "--eval-every", "3", "--to-budget") == 0
    ran()
    written = ab_dir / "plain-s0" / "config.toml"
    text = written.read_text()
    assert "curve_off_clock = true" in text
    written.write_text(text.replace("curve_off_clock = true", "curve_off_clock = false"))
    assert run("--target-heldout", "0.5", "--eval-every", "3", "--to-budget") == 0
    assert ran() == []


def test_a_study_begun_before_its_runs_skipped_profile_png_resumes(study):
    """The early gate's verdict ran its first runs with profile.png drawn in the run: a resume keeps them."""
    run, ran, ab_dir = study
    assert run() == 0
    ran()
    written = ab_dir / "plain-s0" / "config.toml"
    text = written.read_text()
    assert "plot = false" in text
    written.write_text(text.replace("plot = false", "plot = true"))
    assert run() == 0
    assert ran() == []


def test_the_study_draws_each_runs_profile_png_from_its_trace_at_its_end(study, monkeypatch):
    import pipeline.ab._plots as plots

    run, ran, ab_dir = study
    drawn: list[str] = []
    monkeypatch.setattr(plots, "write_plot_from_trace", lambda trace, png: drawn.append(png.parent.name) or True)
    assert run() == 0 and len(ran()) == 6
    assert drawn == []  # the fake runs wrote no profile.json
    for name in ("plain-s0", "gated-s1"):
        (ab_dir / name / "profile.json").write_text("{}")
    (ab_dir / "gated-s1" / "profile.png").write_bytes(b"")  # drawn already: left alone
    assert run() == 0
    assert drawn == ["plain-s0"]
    assert any("profile.png drawn from profile.json for 1 run(s)" in n for n in json.loads((ab_dir / "report.json").read_text())["notes"])


def test_a_named_aa_arm_replaces_the_baseline_copy(study):
    run, ran, ab_dir = study
    assert run("--aa-arm", "gated") == 0
    assert sorted(ran()) == ["gated-s0", "gated-s1", "plain-s0", "plain-s1"]
    report = json.loads((ab_dir / "report.json").read_text())
    assert report["aa_arm"] == "gated" and report["resolution"] == {}
    assert report["noise_floor"]["wall_ratio"] == pytest.approx(math.log(2))  # the "no-op" arm moved wall 0.5x
    assert run("--name", "of", "--aa-arm", "plain", "--aa-of", "gated", "--baseline", "plain") == 2  # the baseline is no A/A arm
    assert run("--name", "of", "--aa-of", "gated") == 2  # --aa-of needs --aa-arm


def test_screening_draws_the_next_seed_before_any_arm_runs_and_the_report_names_the_left_out(study, monkeypatch):
    run, ran, ab_dir = study
    monkeypatch.setenv("AB_WARM", "0:0.0,1:0.4,2:0.5,3:0.9")
    assert run("--screen", "0.1:0.7") == 0
    assert sorted(ran()) == sorted(f"{a}-s{s}" for a in ("plain", "plain-aa", "gated") for s in (1, 2))
    plan = json.loads((ab_dir / "plan.json").read_text())
    assert plan["seeds"] == [1, 2] and plan["screened_out"] == {"0": "warm start wins 0.0 % on dev, outside [10 %, 70 %]"}
    assert "seed 0: warm start wins 0.0 % on dev" in (ab_dir / "report.md").read_text()
    assert run("--screen", "0.1:0.7") == 0 and ran() == []  # resumed: the measures are kept, nothing reruns
    assert run("--name", "x", "--screen", "0.9:0.1") == 2


def test_a_study_measuring_more_tasks_than_dev_holds_screens_on_all_of_dev(study, monkeypatch):
    """A verdict measures 400 tasks per split of final; its screening measure reads dev (200 per split): it measures
    all of dev instead of failing the config (every seed was once screened out as "could not be measured")."""
    run, ran, ab_dir = study
    monkeypatch.setenv("AB_WARM", "0:0.3,1:0.4")
    sets = ["--set", "eval.ranges.dev=8", "--set", 'eval.range="valid"', "--set", "eval.tasks=10"]
    assert run("--screen", "0.1:0.7", *sets) == 0
    assert json.loads((ab_dir / "plan.json").read_text())["seeds"] == [0, 1]
    assert "tasks = 8" in (ab_dir / "screening" / "s0.toml").read_text()


def test_screen_seeds_and_the_pretrain_line():
    kept, out = screen_seeds([5, 6, 7, 8], 2, {5: 0.3, 6: None, 7: 0.05, 8: 0.6}.get, 0.1, 0.7)
    assert kept == [5, 8] and set(out) == {6, 7} and "could not be measured" in out[6]
    assert warm_start_success("heldout_seen: success 30.0% over 4 tasks\nheldout_unseen: success 50.0% over 4\n") == pytest.approx(0.4)
    assert warm_start_success("nothing") is None


def test_report_of_a_folder_that_is_no_study_exits_2_and_list_names_the_presets(study, tmp_path, capsys):
    configs = tmp_path / "configs"
    assert main(["report", str(tmp_path)], load=_load, command=[], configs=configs) == 2
    assert "no plan.json" in capsys.readouterr().err
    assert main(["list"], load=_load, command=[], configs=configs) == 0
    out = capsys.readouterr().out
    assert "plain" in out and "no gate" in out and "small" in out
