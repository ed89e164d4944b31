"""The ledger of decoder work on the tiny budget (configs/budgets/tiny.toml): its fates sum to the run's env steps,
ungated and with a gate that cuts."""

import json
import tomllib
from pathlib import Path

import pytest

from pipeline.ab._presets import flatten
from pipeline.progress import Progress
from pipeline.run.checks import load
from pipeline.run.job import run_job

ROOT = Path(__file__).resolve().parents[1]
TINY = flatten(tomllib.loads((ROOT / "configs" / "budgets" / "tiny.toml").read_text()))


async def _run(tmp_path: Path, *extra: str, gate_options: bool = True) -> dict:
    budget = [item for item in TINY if gate_options or not item.startswith("gate.")]
    overrides = [*budget, "run.max_wall_s=900", f'run.out="{tmp_path}/runs"', f'policy.cache_dir="{tmp_path}/cache"', *extra]
    cfg = load(ROOT / "configs" / "base.toml", overrides)
    result = await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    written = json.loads((result.run_dir / "summary.json").read_text())
    ledger = written["ledger"]
    fates = ledger["fates"]
    assert sum(f["env_steps"] for f in fates.values()) == ledger["env_steps"] == written["env_steps"] > 0
    assert sum(f["tokens"] for f in fates.values()) == ledger["tokens"] > 0
    assert sum(f["groups"] for f in fates.values()) == written["groups_admitted"]
    assert fates["trained_informative"]["groups"] + fates["trained_zero_variance"]["groups"] == written["groups_trained"]
    assert fates["trained_informative"]["groups"] == written["groups_trained_informative"]
    for key in ("learner_waiting", "pacer_holding", "slot_occupancy"):
        assert 0.0 <= ledger["idle"][key] <= 1.0, key
    assert "## Decoder work by fate" in (result.run_dir / "summary.md").read_text()
    return written


@pytest.mark.slow
async def test_an_ungated_tiny_run_accounts_for_every_env_step(tmp_path):
    written = await _run(tmp_path, "gate.enabled=false")
    fates = written["ledger"]["fates"]
    assert fates["cut"]["groups"] == 0
    assert fates["trained_informative"]["groups"] + fates["trained_zero_variance"]["groups"] >= 2 * 2  # 2 updates x B = 2


@pytest.mark.slow
async def test_a_gated_tiny_run_accounts_for_the_cut_groups_work(tmp_path):
    written = await _run(tmp_path, "gate.enabled=true", 'gate.name="tests.plugin_gates:CutEvenGroups"', "gate.shadow=false",
                         gate_options=False)  # the budget's gate.k is the stall gate's option
    ledger = written["ledger"]
    assert ledger["fates"]["cut"]["groups"] == written["groups_cut"] >= 1
    assert sum(ledger["cut_at_step"].values()) == written["groups_cut"]
    assert ledger["cut_at_step"].keys() <= {"1", "2"}  # the test gate cuts once every member has 1 step
    assert ledger["cut_spent_steps"]["max"] <= 2 * 4  # at most 2 steps x G = 4


@pytest.mark.slow
async def test_pilots_the_allocator_drops_are_dropped_not_unfinished(tmp_path):
    written = await _run(tmp_path, "gate.enabled=false", 'allocator.name="pilot_commit"', "run.max_wall_s=20")
    fates = written["ledger"]["fates"]
    dropped = fates["dropped_all_fail"]["groups"] + fates["dropped_all_succeed"]["groups"] + \
        fates["dropped_by_allocator"]["groups"]
    assert dropped >= written["allocator_stats"]["allocator/prompts_dropped"] - 8 > 0  # (a few may be queued at the end)
    assert fates["unfinished"]["groups"] <= 8 + 4  # running at the end (8 slots) and queued pilots, not every drop
