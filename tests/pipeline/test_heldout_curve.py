"""pipeline/heldout_curve.py: which weights a run kept, the stamp of the update that published each, and the rows of
heldout_curve.jsonl (what the run writes with eval.curve_off_clock and `run.py curve` writes, and the harness reads)."""

import json

from pipeline.heldout_curve import (
    CURVE_FILE,
    append_row,
    curve_row,
    kept_versions,
    measured,
    stamps,
    unmeasured,
)


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
    assert list(unmeasured(tmp_path)) == [6]  # the curve misses a kept version


def test_a_row_a_crash_cut_short_is_measured_again_on_a_line_of_its_own(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    for version in (1, 2):
        (tmp_path / "checkpoints" / f"policy-v{version}.pt").write_bytes(b"")
    assert unmeasured(tmp_path).keys() == {1, 2} and measured(tmp_path) == {}  # no curve file yet
    first = curve_row(1, {"wall_s": 1.0}, {"mean": 0.1}, "valid")
    (tmp_path / CURVE_FILE).write_text(json.dumps(first) + "\n" + json.dumps(curve_row(2, {}, {}, "valid"))[:20])
    assert set(measured(tmp_path)) == {1} and list(unmeasured(tmp_path)) == [2]
    append_row(tmp_path / CURVE_FILE, curve_row(2, {"wall_s": 2.0}, {"mean": 0.2}, "valid"))
    assert measured(tmp_path)[2]["heldout/mean"] == 0.2 and unmeasured(tmp_path) == {}
    assert measured(tmp_path)[1] == first
