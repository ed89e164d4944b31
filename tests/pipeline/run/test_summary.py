"""The job's summary helpers: the gate label shows the gate's resolved options (its own defaults
included), held-out reports survive the checkpoint's JSON round trip, the paired before / after change matches
tasks and its interval is Student's t of the per-task differences, the episodes file holds every episode."""

import json
from types import SimpleNamespace

from gates import build_gate
from pipeline.config import load_config
from pipeline.run.summary import (
    family_table,
    fmt_change,
    fmt_eval,
    gate_label,
    mean_success,
    paired_change,
    policy_figures,
    reports_from_json,
    reports_to_json,
    write_episodes,
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


def _reports(**splits):
    return {split: summarize([EpisodeOutcome(f"t{i}", "f", bool(w), 5) for i, w in enumerate(won)])
            for split, won in splits.items()}


def test_the_paired_change_matches_tasks_by_split_and_id():
    before = _reports(heldout_seen=[0, 0, 1, 0], heldout_unseen=[1, 0])
    after = _reports(heldout_seen=[1, 0, 1, 1], heldout_unseen=[0, 0])
    change = paired_change(before, after)
    assert change["tasks"] == 6 and change["gained"] == 2 and change["lost"] == 1
    assert change["change"] == 1 / 6
    low, high = change["ci95"]
    assert low < 1 / 6 < high  # differences +1, 0, 0, +1, -1, 0: sd 0.753, t(5) 2.571, half-width 0.790
    assert abs((high - low) / 2 - 2.5706 * 0.7528 / 6**0.5) < 1e-3
    assert fmt_change(change).startswith("+16.7 points [-62.3, +95.7] (95 % t) over 6 tasks (2 won only after, 1 only before)")


def test_a_task_measured_once_is_left_out_of_the_paired_change():
    before = _reports(heldout_seen=[0, 1])
    after = _reports(heldout_seen=[1, 1, 1])  # t2 was not measured before
    assert paired_change(before, after)["tasks"] == 2
    assert paired_change(before, {}) is None and fmt_change(None) == "no task measured both times"
    one = paired_change(_reports(heldout_seen=[0]), _reports(heldout_seen=[1]))
    assert one["ci95"] == [None, None] and fmt_change(one) == "+100.0 points over 1 tasks (1 won only after, 0 only before)"


def test_the_episodes_file_holds_every_episode_before_and_after(tmp_path):
    before, after = _reports(heldout_seen=[0, 1]), _reports(heldout_seen=[1, 1])
    write_episodes(tmp_path, "dev", before, after)
    data = json.loads((tmp_path / "heldout_episodes.json").read_text())
    assert data["range"] == "dev"
    assert reports_from_json(data["before"]) == before and reports_from_json(data["after"]) == after


def test_the_policy_figures_keep_what_its_backend_counts():
    from stages.policy.base import PolicyStatistics
    from stages.policy.hf._server import HfStatistics

    common = {"requests": 10, "answered": 9, "abandoned": 1, "generated_tokens": 40, "version": 2}
    assert policy_figures(PolicyStatistics(**common)) == common
    hf = policy_figures(HfStatistics(**common, batches=3, rows_scored=8, commands_scored=120, prompt_tokens=1500,
                                     command_tokens=700))
    assert hf == common | {"batches": 3, "rows_scored": 8, "commands_scored": 120, "prompt_tokens": 1500,
                           "command_tokens": 700}
