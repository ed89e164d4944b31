"""The held-out curve off the run's clock: which kept weights there are, the stamp of the update that published
each, and the rows `run.py curve` writes (read by the A/B report as it reads in-run rows)."""

import json

from pipeline.ab._report import read_run
from pipeline.run.offclock import CURVE_FILE, curve_row, kept_versions, measured, stamps


def test_kept_versions_stamps_and_rows(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    for name in ("policy-v0003.pt", "policy-v0006.pt", "state.pt", "policy-vX.pt"):
        (tmp_path / "checkpoints" / name).write_bytes(b"")
    assert list(kept_versions(tmp_path)) == [3, 6]
    rows = [{"iteration": 3, "wall_s": 30.5, "env_steps": 300, "generated_tokens": 1500, "success_rate": 0.2},
            {"iteration": 6, "wall_s": 61.0, "env_steps": 600},
            {"iteration": 6, "wall_s": 70.0, "heldout/mean": 0.4}]  # an in-run measure row is no stamp
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    when = stamps(tmp_path)
    assert when == {3: {"wall_s": 30.5, "env_steps": 300, "generated_tokens": 1500}, 6: {"wall_s": 61.0, "env_steps": 600}}
    row = curve_row(3, when[3], {"seen": 0.5, "unseen": 0.3, "mean": 0.4}, "valid")
    assert row["heldout/mean"] == 0.4 and row["wall_s"] == 30.5 and row["heldout_range"] == "valid"
    (tmp_path / CURVE_FILE).write_text(json.dumps(row) + "\n")
    assert set(measured(tmp_path)) == {3}


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
