"""The default gate (`stall`) end to end on the tiny budget: it cuts, no cut group reaches the learner, and
the summary's gate figures are filled. Every other tiny run pins the prefix gate or a test gate.

Tiny settings beyond `tests.test_run_integration.TINY` (the defaults are unchanged), measured on the tiny
policy with a never-cutting stall gate (3 updates, 8 groups of 4 evaluated at each K):
* Free decoding: the tiny policy's commands are almost never admissible, s_K = 0.0 for every group at
  every K in 1..6: the default tau (0.9) would cut every group and the learner would never train.
  `choose_admissible` with `choose_by = "command"` (the learn preset's decoding) makes every action
  admissible, so progress is whether the observation is new.
* `gate.k=2`: episodes last at most `env.max_steps = 8` steps, so at the default first checkpoint (K = 8)
  nobody is still running (s_8 = 1.0, never a cut) and the later ones (12, 16, 20) are never reached. At
  K = 2 step 0 is always progress and s_2 = (4 + p) / 8, p = members whose step 1 was progress (measured
  p = 0, 1, 2, 3 in 2, 3, 2, 1 of 8 groups; later K fall below 0.9 for every group: all cut again).
* `gate.tau=0.7`: cut iff p <= 1, so some groups are cut and others train in the same run (5 of those 8
  would be cut; in this test's runs 2 to 7 of the 6 to 13 groups decided). The tiny policy never won in
  those groups, so every cut is of an all-fail group.
Window (5) stays the default.
"""

import json

import pytest
import trio

from gates import build_gate
from gates.stall import StallGate
from pipeline.progress import Progress
from pipeline.run.checks import load
from pipeline.run.job import RunInterrupted, run_job
from tests.plugin_faults import STOPS
from tests.test_run_integration import TINY, _tiny

ADMISSIBLE_ONLY = TINY[-1].replace("bc_eval_tasks = 0}", 'bc_eval_tasks = 0, choose_admissible = true, choose_by = "command"}')


@pytest.mark.slow
async def test_the_default_stall_gate_cuts_and_no_cut_group_reaches_the_learner(tmp_path):
    stop = STOPS["stall"] = trio.Event()
    settings = [s for s in _tiny(tmp_path, ADMISSIBLE_ONLY) if not s.startswith("gate.name=")]  # the default gate
    cfg = load(None, [*settings, "gate.k=2", "gate.tau=0.7", "run.updates=1000", "run.name=stall",
                      'stages=[{target = "tests.plugin_stages:StopOnCutsAndUpdates", options = {key = "stall", cuts = 2, updates = 2}}]'])
    assert cfg.gate.name == "stall" and cfg.gate.enabled and not cfg.gate.shadow
    gate = build_gate(cfg.gate.name, cfg.gate.gate_options())
    assert isinstance(gate, StallGate) and gate.window == StallGate.Options().window and gate.checkpoints == [2, 12, 16, 20]
    # The run stops once 2 cut groups have finished and 2 updates are in (or after 20 updates or 40 cuts:
    # then the counts below fail), not after some time: a loaded machine makes it slower, never different.
    with pytest.raises(RunInterrupted):
        await run_job(cfg, progress=Progress(1000, enabled=False), stop=stop)
    run_dir = tmp_path / "runs" / "stall"
    summary = json.loads((run_dir / "summary.json").read_text())
    print({k: summary[k] for k in ("groups_admitted", "groups_cut", "groups_trained", "learner_updates",
                                   "gate_decisions_by_kind", "first_stage_cut_fraction")})

    assert summary["gate"] == "stall K=2 tau=0.7"
    assert summary["groups_cut"] >= 2 and summary["learner_updates"] >= 2
    assert summary["cut_groups_reaching_learner"] == 0  # neither refused by the learner nor emitted by the allocator
    assert summary["groups_trained"] == 2 * summary["learner_updates"]  # batches of uncut groups only
    assert 0 <= summary["groups_trained_informative"] <= summary["groups_trained"]
    # The gate's figures: it decided on every first-stage group it saw (all plain groups here) and cut some.
    decisions, seen = summary["gate_decisions_by_kind"], summary["gate_groups_seen_by_kind"]
    assert set(decisions) == {"group"} and set(seen) == {"group"}
    assert summary["groups_cut"] <= decisions["group"] <= seen["group"]
    assert 0 < summary["first_stage_cut_fraction"] < 1
    assert summary["gate_us_per_decision"] > 0 and summary["gate_cpu_us_per_decision"] > 0
    assert summary["gate_precision"] is None and summary["gate_recall"] is None  # shadow figures: not a shadow run
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(r["gate/decisions"] >= 1 for r in rows)
