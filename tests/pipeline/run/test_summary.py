"""The job's summary helpers: the gate label shows the gate's resolved options (its own defaults
included), held-out reports survive the checkpoint's JSON round trip."""

from types import SimpleNamespace

from gates import build_gate
from pipeline.config import load_config
from pipeline.run.summary import (
    family_table,
    fmt_eval,
    gate_label,
    mean_success,
    reports_from_json,
    reports_to_json,
)
from stages.evaluate import EpisodeOutcome, summarize


def _outcome(cfg):
    return SimpleNamespace(gate=SimpleNamespace(gate=build_gate(cfg.gate.name, cfg.gate.gate_options())))


def test_the_gate_label_shows_the_gates_own_defaults_and_what_overrides_them():
    cfg = load_config()
    assert gate_label(cfg, _outcome(cfg)) == "stall K=8 tau=0.9"
    cfg = load_config(None, ['gate.name="prefix_edit_distance"', "gate.tau=0.3", "gate.shadow=true"])
    assert gate_label(cfg, _outcome(cfg)) == "prefix_edit_distance K=12 tau=0.3 shadow"
    assert gate_label(load_config(None, ["gate.enabled=false"]), SimpleNamespace(gate=None)) == "off"


def test_reports_survive_the_json_round_trip():
    reports = {"heldout_seen": summarize([EpisodeOutcome("a", "f", True, 3), EpisodeOutcome("b", "g", False, 30)])}
    back = reports_from_json(reports_to_json(reports))
    assert back == reports
    assert mean_success(back) == 0.5 and mean_success({}) is None
    assert fmt_eval(back) == "heldout_seen 50.0% (2 tasks)" and fmt_eval({}) == "skipped (eval.tasks = 0)"
    assert "| heldout_seen | f | 100.0% | 100.0% |" in family_table(back, back)
