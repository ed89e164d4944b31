"""The held-out curve off the run's clock: the run measures its kept weights itself once its figures are written
(`eval.curve_off_clock`), in rows of the form `run.py curve` writes (read by the A/B report as it reads in-run
rows); `run.py curve` measures only what is left."""

import json
import shutil
import tomllib
from functools import partial
from pathlib import Path

import pytest
import trio

import pipeline.run.job as job
from pipeline.ab._presets import flatten
from pipeline.ab._report import read_run
from pipeline.config import RunConfig
from pipeline.heldout_curve import CURVE_FILE, curve_row
from pipeline.progress import Progress
from pipeline.run import offclock
from pipeline.run.checks import load
from pipeline.run.parts import RunParts

ROOT = Path(__file__).resolve().parents[3]
TINY = flatten(tomllib.loads((ROOT / "configs" / "budgets" / "tiny.toml").read_text()))


def test_the_report_reads_the_off_clock_curve_with_its_publication_stamp(tmp_path):
    summary = {"stop_reason": "updates", "grpo_wall_s": 90.0, "env_steps": 900, "heldout_success_before": 0.2,
               "heldout_success_after": 0.5}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"iteration": 3, "wall_s": 30.5, "env_steps": 300}) + "\n")
    (tmp_path / CURVE_FILE).write_text(json.dumps(curve_row(3, {"wall_s": 30.5, "env_steps": 300}, {"mean": 0.45}, "valid")) + "\n")
    record = read_run("a", 0, tmp_path)
    assert record.periodic and [(p.wall_s, p.mean, p.periodic) for p in record.curve] == [
        (0.0, 0.2, False), (30.5, 0.45, True), (90.0, 0.5, False)]


def test_run_py_curve_of_a_folder_that_is_no_run_exits_2(tmp_path, capsys):
    import run

    assert run.main(["curve", str(tmp_path)]) == 2
    assert "is not a run folder" in capsys.readouterr().err


@pytest.mark.slow
def test_the_run_measures_its_kept_weights_once_its_figures_are_written_as_run_py_curve_would(tmp_path, monkeypatch):
    import run

    cfg = load(ROOT / "configs" / "base.toml", [*TINY, "run.max_wall_s=900", f'run.out="{tmp_path}/runs"',
                                                 f'policy.cache_dir="{tmp_path}/cache"', "gate.enabled=false", "eval.every=0",
                                                 "run.keep_weights_every=1", "eval.curve_off_clock=true"])
    seen = {}
    measure_kept = offclock.measure_kept

    async def spy(cfg, run_dir, policy, suite, **options):
        seen["summary"] = (run_dir / "summary.json").read_text()  # the figures are written before the curve starts
        seen["policy"] = policy
        return await measure_kept(cfg, run_dir, policy, suite, **options)

    monkeypatch.setattr(offclock, "measure_kept", spy)
    built = []
    policy = job.build.policy
    monkeypatch.setattr(job.build, "policy", lambda *a, **k: built.append(policy(*a, **k)) or built[-1])
    result = trio.run(partial(job.run_job, cfg, progress=Progress(cfg.run.updates, enabled=False)))
    folder = result.run_dir
    # on the run's own policy (no second one built), after its summary, which the curve leaves as it was
    assert built == [seen["policy"]] and (folder / "summary.json").read_text() == seen["summary"]
    assert json.loads(seen["summary"]) == json.loads(json.dumps(result.summary))
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert not any(k.startswith("heldout/") for row in metrics for k in row)  # nothing measured on the GRPO clock
    in_run = [json.loads(line) for line in (folder / CURVE_FILE).read_text().splitlines()]
    assert [r["iteration"] for r in in_run] == [1, 2]
    # `run.py curve` on the same folder: nothing left to measure, so nothing changes ...
    assert run.main(["curve", str(folder)]) == 0 and [json.loads(x) for x in (folder / CURVE_FILE).read_text().splitlines()] == in_run
    # ... and measuring it afresh, in a process's own policy, gives the very same rows
    shutil.move(folder / CURVE_FILE, tmp_path / "in_run.jsonl")
    assert run.main(["curve", str(folder)]) == 0
    assert [json.loads(line) for line in (folder / CURVE_FILE).read_text().splitlines()] == in_run


async def test_ctrl_c_during_the_curve_stops_the_measure_not_the_finished_run(tmp_path, monkeypatch):
    stop = trio.Event()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "policy-v2.pt").write_bytes(b"")

    async def measure_kept(cfg, run_dir, policy, suite, *, say):
        stop.set()  # Ctrl-C while measuring
        await trio.sleep_forever()

    said = []
    monkeypatch.setattr(offclock, "measure_kept", measure_kept)
    progress = Progress(1, enabled=False)
    monkeypatch.setattr(progress, "message", said.append)
    parts = RunParts(cfg=RunConfig(), run_dir=tmp_path, suite=None, policy=None, tasks={}, allocator=None, trainer=None,
                     profiler=None, metrics=None, observers=[], progress=progress, checkpointer=None)
    await job._curve_off_clock(parts, stop)  # returns: the run's figures are written, it is finished
    assert said and "1 version(s) unmeasured" in said[-1] and f"run.py curve {tmp_path}" in said[-1]


async def test_a_curve_measure_that_fails_is_one_line_naming_run_py_curve(tmp_path, monkeypatch):
    async def measure_kept(cfg, run_dir, policy, suite, *, say):
        raise ValueError("weights for version 2 do not fit the model")

    monkeypatch.setattr(offclock, "measure_kept", measure_kept)
    parts = RunParts(cfg=RunConfig(), run_dir=tmp_path, suite=None, policy=None, tasks={}, allocator=None, trainer=None,
                     profiler=None, metrics=None, observers=[], progress=None, checkpointer=None)
    with pytest.raises(job.RunFailed, match=r"held-out curve after the run failed: ValueError: weights for version 2 .*"
                                            rf"run itself finished.*run.py curve {tmp_path}"):
        await job._curve_off_clock(parts, trio.Event())
