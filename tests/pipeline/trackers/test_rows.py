"""What a tracker is given of a metrics row, of the summary and of the config."""

import math

from pipeline.trackers import flat_params, scalars, summary_scalars, tracker_row


def test_scalars_keep_finite_numbers_only():
    row = {"a": 1, "b": 0.5, "c": True, "d": None, "e": math.nan, "f": math.inf, "g": "text", "h": [1], "i": {"x": 1}}
    assert scalars(row) == {"a": 1.0, "b": 0.5, "c": 1.0}


def test_an_update_row_keeps_its_keys_and_a_heldout_row_puts_its_own_figures_under_heldout():
    assert tracker_row({"iteration": 4, "wall_s": 9.0, "learner/approx_kl": 0.1}) == (4, {"wall_s": 9.0, "learner/approx_kl": 0.1})
    step, values = tracker_row({"iteration": 4, "wall_s": 12.0, "env_steps": 100, "eval_s": 3.0, "heldout/mean": 0.25})
    assert (step, values) == (4, {"heldout/wall_s": 12.0, "heldout/env_steps": 100.0, "heldout/eval_s": 3.0, "heldout/mean": 0.25})


def test_summary_figures_go_under_summary():
    assert summary_scalars({"learner_updates": 10, "stop_reason": "updates", "by_family": {"a": 1}}) == {"summary/learner_updates": 10.0}


def test_flat_params_flatten_sections_and_option_tables():
    config = {"run": {"seed": 0, "trackers": ["wandb"], "progress": True}, "policy": {"options": {"layers": 2}, "model": ""},
              "gate": {"options": {}, "k": None}}
    assert flat_params(config) == {"run.seed": "0", "run.trackers": "['wandb']", "run.progress": "true",
                                   "policy.options.layers": "2", "policy.model": "", "gate.options": "{}"}
