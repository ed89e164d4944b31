"""The whole pipeline on a tiny budget: cuts happen, freed slots are backfilled, the learner updates,
and no cut group ever reaches the learner. Also the CLI's exit codes and a clean Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import structlog
import trio

from pipeline.progress import Progress
from pipeline.run import build
from pipeline.run.checks import load
from pipeline.run.job import RunInterrupted, run_job
from tests.plugin_faults import STOPS

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    "gate.name=prefix_edit_distance",  # the tiny runs were written for the prefix gate (default: stall)
    "env.max_steps=8",
    "env.train_tasks=64",
    "rollout.group_size=4",
    "rollout.slots=16",
    "learner.batch_groups=2",
    "learner.drop_zero_variance=false",
    "learner.max_staleness=1",
    "run.updates=2",
    "policy.workers=1",  # decode in the test's process (the default, "auto", starts a decoding process per core)
    # A safety net, not a stop: every tiny run stops on the updates (or the event) its test asserts on, so a
    # loaded machine makes it slower, never different (a 50 s limit once ended runs before their updates).
    "run.max_wall_s=900",
    "eval.tasks=4",
    "pretrain.demos=24",
    "pretrain.epochs=1",
    "policy.max_new_tokens=10",
    "policy.options={layers = 1, d_model = 32, heads = 2, max_len = 128, max_prompt_tokens = 100, bc_eval_tasks = 0}",
]


BASE = ["--config", str(ROOT / "configs" / "base.toml")]
"""run.py's argument for the base values TINY is written on (without --config run.py runs the default run,
configs/default.toml: gate off, the learn preset's learner)."""


def _tiny(tmp_path: Path, *extra: str) -> list[str]:
    return TINY + [f'run.out="{tmp_path}/runs"', f'policy.cache_dir="{tmp_path}/cache"', *extra]


@pytest.mark.slow
async def test_pipeline_cuts_backfills_and_trains_on_a_tiny_budget(tmp_path):
    cfg = load(None, _tiny(tmp_path, 'gate.name="tests.plugin_gates:CutEvenGroups"'))
    result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    summary = result.summary
    assert summary["groups_cut"] >= 1
    assert summary["groups_backfilled"] >= 1
    assert summary["learner_updates"] >= 1
    assert summary["cut_groups_reaching_learner"] == 0
    outcome = result.outcome
    assert outcome.counters.cut_emission_refused == 0  # the allocator never emitted a cut group (counted, not listed)
    assert outcome.counters.cut_groups_refused == 0

    run_dir = result.run_dir
    for name in ("config.toml", "metrics.jsonl", "events.jsonl", "summary.md", "summary.json", "checkpoints/policy.pt"):
        assert (run_dir / name).exists(), name
    written = json.loads((run_dir / "summary.json").read_text())
    for key in ("groups_admitted", "groups_cut", "groups_trained", "zero_variance_fraction", "gate_precision",
                "gate_recall", "slot_occupancy", "env_steps", "learner_updates", "heldout_success_before",
                "heldout_success_after", "wall_s"):
        assert key in written, key
    from pipeline.profiling import load_report, validate_trace

    profiled = {row.stage for row in load_report(run_dir).rows}
    assert {"rollout", "gate", "policy", "learner"} <= profiled
    assert validate_trace(json.loads((run_dir / "profile.json").read_text())) == []
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    assert load(run_dir / "config.toml", []) == cfg
    assert written["profiler_overhead_pct"] < 3.0
    tally = outcome.counters
    assert summary["groups_all_fail"] + summary["groups_mixed"] + summary["groups_all_succeed"] == tally.groups_complete
    assert summary["groups_all_fail"] + summary["groups_all_succeed"] == tally.zero_variance_complete  # 0/1 rewards
    by_family = summary["groups_by_family"]  # every train task has a family: the breakdown adds up
    assert sum(sum(kinds.values()) for kinds in by_family.values()) == tally.groups_complete
    assert "## Training groups by family" in (run_dir / "summary.md").read_text()
    # what held the loop: named in the summary, and a `loop` span of the profile for each
    blocked = {row["name"]: row["count"] for row in written["loop_blockers"]}
    assert "## What held the event loop" in (run_dir / "summary.md").read_text()
    trace = json.loads((run_dir / "profile.json").read_text())["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    spans = [e["name"] for e in trace if e["ph"] == "X" and tracks[e["tid"]].split(" #")[0] == "loop"]
    assert all(spans.count(name) == count for name, count in blocked.items()), (blocked, len(spans))
    # where memory peaked: the peak so far as each phase ended, rising, the last one the run's peak
    peaks = written["peak_rss_mb_by_phase"]
    assert list(peaks) == ["build", "before", "grpo", "after"]
    assert list(peaks.values()) == sorted(peaks.values()) and 0 < peaks["after"] <= written["peak_rss_mb"] + 0.1
    counts = written["policy_statistics"]  # torch_tiny's: the common five and its batches, no other backend's
    assert set(counts) == {"requests", "answered", "abandoned", "generated_tokens", "version", "batches"}
    assert counts["version"] == summary["learner_updates"] and counts["answered"] <= counts["requests"]
    # every held-out episode, before and after, and their paired change over the same tasks
    episodes = json.loads((run_dir / "heldout_episodes.json").read_text())
    assert set(episodes["before"]) == set(episodes["after"]) == set(cfg.eval.splits)
    change = written["heldout_change"]
    assert change["tasks"] == sum(len(rows) for rows in episodes["after"].values())
    assert abs(change["change"] - (written["heldout_success_after"] - written["heldout_success_before"])) < 1e-9
    assert written["heldout_before_version"] == 0  # measured on the warm start

    # The job closed its events.jsonl: events logged after it must not go to the closed file.
    events_size = (run_dir / "events.jsonl").stat().st_size
    structlog.get_logger("after-the-job").info("still logging")
    assert (run_dir / "events.jsonl").stat().st_size == events_size


@pytest.mark.slow
async def test_shadow_mode_cuts_nothing_and_scores_decisions(tmp_path):
    cfg = load(None, _tiny(tmp_path, 'gate.name="tests.plugin_gates:CutEvenGroups"', "gate.shadow=true", "run.updates=3"))
    result = await run_job(cfg, progress=Progress(3, enabled=False))
    assert result.summary["groups_cut"] == 0
    assert result.outcome.rollout.shadow_cancels >= 1
    ledger = result.outcome.gate.ledger
    assert ledger.true_positive + ledger.false_positive >= 1  # even groups were flagged and scored
    assert result.summary["gate_precision"] == ledger.precision()


def test_bad_config_exits_2_and_lists_every_problem(tmp_path):
    proc = subprocess.run(
        [sys.executable, "run.py", "check", "--set", "gate.tau=-1", "--set", "env.name=nowhere", "--set", "allocator.name=zzz"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    for fragment in ("gate.tau must be >= 0", "env.name: unknown envs 'nowhere'", "allocator.name"):
        assert fragment in proc.stderr, proc.stderr


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_promptly(tmp_path):
    args = [sys.executable, "run.py", *BASE, *[a for s in _tiny(tmp_path, "gate.k=4", "run.updates=1000", "run.max_wall_s=300") for a in ("--set", s)]]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONUNBUFFERED": "1"})
    try:
        # wait until the GRPO phase is running (its banner line), then interrupt
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            if line.startswith("GRPO:") or time.monotonic() > deadline:
                break
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        proc.wait(timeout=60)
        stop_s = time.monotonic() - sent
        print(f"SIGINT to exit: {stop_s:.2f} s")  # ~2 s idle; the bound catches a hang, not a slow machine
        assert stop_s < 20.0, stop_s
        assert proc.returncode == 130, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("allocator", "options"),
    [("pilot_commit", "{p_lo = 0.0, p_up = 0.0}"), ("aero", "{}")],  # pilot-commit: commit every pilot
)
async def test_allocator_sub_groups_are_never_gated_and_staleness_is_a_bound(tmp_path, allocator, options):
    # The gate would cut every even group at its first step, commit and rescue groups included, if it saw them.
    # The run stops once it has had later-stage groups to leave alone (the event the test asserts on): AERO on
    # the tiny policy trains nothing (every group is in its dead zone), so it would never reach run.updates.
    stop = STOPS[allocator] = trio.Event()
    observer = f'stages=[{{target = "tests.plugin_stages:StopOnLaterStageGroups", options = {{key = "{allocator}"}}}}]'
    cfg = load(None, _tiny(tmp_path, f"allocator.name={allocator}", f"allocator.options={options}", "run.updates=1000",
                           'gate.name="tests.plugin_gates:CutEvenGroups"', "learner.max_staleness=0", observer,
                           f"run.name={allocator}"))
    with pytest.raises(RunInterrupted):
        await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False), stop=stop)
    result_dir = tmp_path / "runs" / allocator
    summary = json.loads((result_dir / "summary.json").read_text())
    first_stage = {"pilot", "explore", "group"}
    assert set(summary["gate_decisions_by_kind"]) <= first_stage
    assert set(summary["gate_groups_seen_by_kind"]) - first_stage, "the run had later-stage groups to leave alone"
    assert summary["staleness_lag_max"] <= cfg.learner.max_staleness
    rows = [json.loads(line) for line in (result_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["staleness_lag_max"] <= cfg.learner.max_staleness for r in rows if "staleness_lag_max" in r)
    for key in ("trajectory_slot_occupancy", "first_stage_cut_fraction", "items_dropped_stale", "items_beyond_max", "staleness_lag_mean",
                "generated_tokens"):
        assert key in summary, key



@pytest.mark.slow
async def test_the_family_allocator_runs_a_job_and_reports_its_weights(tmp_path):
    cfg = load(None, _tiny(tmp_path, "allocator.name=family", "allocator.options={power = 2.0}", "gate.enabled=false"))
    result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    weights = [{k: v for k, v in r.items() if k.startswith("allocator/weight/")} for r in rows if "allocator/groups_admitted" in r]
    assert len(weights) == cfg.run.updates
    families = {t.family for t in build.suite(cfg).tasks("train")}
    assert all({k.removeprefix("allocator/weight/") for k in w} == families for w in weights)
    assert all(sum(w.values()) == pytest.approx(1.0) for w in weights)

@pytest.mark.slow
async def test_periodic_heldout_evaluation_writes_a_learning_curve(tmp_path):
    writer = 'stages=[{target = "examples.jsonl_writer:JsonlGroupWriter"}]'  # every group the rollouts played
    cfg = load(None, _tiny(tmp_path, "eval.every=1", "gate.k=4", writer))
    result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "heldout/mean" in r]
    assert [r["iteration"] for r in evals] == [1]  # the last update is the job's after-measure
    assert all({"heldout/seen", "heldout/unseen", "wall_s", "env_steps"} <= r.keys() for r in evals)
    assert all(r["heldout_range"] == "valid" for r in evals)  # the curve watches valid ...
    assert result.summary["heldout_curve"] == evals
    assert (result.summary["heldout_range"], result.summary["heldout_curve_range"]) == ("dev", "valid")  # ... the measure dev
    assert (result.run_dir / "learning_curve.png").exists()
    # GRPO's rollouts play train tasks only: no held-out task of any range
    played = {json.loads(line)["task_id"] for line in (result.run_dir / "groups.jsonl").read_text().splitlines()}
    assert played and all(task.startswith("household/train/") for task in played)
    # the machine's load during the GRPO phase is in the summary
    summary = result.summary
    assert summary["load_1m_min"] <= summary["load_1m_mean"] <= summary["load_1m_max"]
    assert summary["cores_available"] >= 1 and summary["run_cpu_s"] > 0 and summary["other_cpu_s"] >= 0
    assert isinstance(summary["machine_loaded"], bool) and "load_1m_mean" in (result.run_dir / "summary.md").read_text()


@pytest.mark.slow
async def test_custom_stages_see_every_event_and_a_failing_one_is_named(tmp_path):
    from pipeline.run.job import RunFailed
    from tests.plugin_stages import Recorder

    Recorder.seen = []
    cfg = load(None, _tiny(tmp_path, "gate.k=4", 'stages=[{target = "tests.plugin_stages:Recorder"}]'))
    await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    assert Recorder.seen == [1, 2, "finished"]  # the last WeightsPublished arrives before the phase ends

    cfg = load(None, _tiny(tmp_path, "gate.k=4", "run.updates=1000", 'stages=[{target = "tests.plugin_stages:Explodes"}]'))
    with pytest.raises(RunFailed) as info:
        await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    assert str(info.value).startswith("stage 'explodes': ValueError: the plugin has a bug.")  # what run.py prints


@pytest.mark.slow
async def test_the_learn_preset_runs_and_acts_only_admissible_commands(tmp_path):
    """configs/learn.toml on a tiny budget (not its rise): mixed labels, whole commands chosen end to end, all turns trained."""
    preset = load(ROOT / "configs" / "learn.toml", [])
    assert preset.policy.options["choose_by"] == "command"
    choosing = ", ".join(f"{k} = {json.dumps(preset.policy.options[k])}" for k in ("choose_admissible", "choose_by"))
    options = TINY[-1].replace("bc_eval_tasks = 0}", f"bc_eval_tasks = 0, {choosing}}}")
    cfg = load(ROOT / "configs" / "learn.toml", _tiny(tmp_path, options, "eval.every=1", "gate.k=4", f"policy.workers={preset.policy.workers}"))
    assert cfg.policy.options["choose_by"] == "command" and cfg.learner.max_items == 0
    assert cfg.env.options["recovery"] == "mixed"  # the searching warm start's labels, built here in one epoch
    assert cfg.learner.ema > 0 and not cfg.gate.enabled  # a moving average is published; every group trains
    assert cfg.learner.lr_schedule == "linear" and cfg.run.updates >= 2  # the lr decays over the run's updates
    assert cfg.learner.step_weight > 0 and cfg.learner.skip_confident > 0 and cfg.policy.workers == 2  # GiGPO, sure turns skipped
    assert cfg.allocator.name == "family"  # slots by each family's recent share of mixed groups
    result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    assert result.summary["learner_updates"] == cfg.run.updates
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "learner/invalid_action_fraction" in r]
    assert updates and all(r["learner/invalid_action_fraction"] == 0.0 for r in updates)
    assert all("learner/step_signal_fraction" in r for r in updates)
    assert all(0.0 <= r["learner/skipped_confident"] <= 1.0 for r in updates if r["learner/items"] > 0)
    lrs = [r["learner/lr"] for r in updates]
    assert lrs[0] == cfg.learner.lr and all(a > b for a, b in zip(lrs, lrs[1:], strict=False))
    assert any(r.get("heldout/mean") is not None for r in rows)  # the periodic learning curve


@pytest.mark.slow
async def test_the_zero_variance_gate_learns_online_on_a_tiny_budget(tmp_path):
    """The early gate end to end: its warm-up labels train it (refits in worker threads), it reports its live
    figures, the family allocator's admission asks it, and no cut group reaches the learner."""
    options = "{warmup = 6, refit_every = 3, explore = 0.25, min_flagged = 2, min_precision = 0.5}"
    cfg = load(None, _tiny(tmp_path, 'gate.name="zero_variance"', f"gate.options={options}", "run.updates=4",
                           'allocator.name="family"'))
    result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    summary = result.summary
    assert summary["cut_groups_reaching_learner"] == 0 and summary["learner_updates"] >= 1
    predictor = summary["gate_predictor"]
    assert predictor["unbiased_labels"] >= 6 and predictor["refits"] >= 1
    assert predictor["admission_screened"] >= 1  # the allocator asked at admission
    assert "Zero-variance predictor" in (result.run_dir / "summary.md").read_text()
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("gate/zv/unbiased_labels" in row for row in rows)  # in the run's metrics as it goes
