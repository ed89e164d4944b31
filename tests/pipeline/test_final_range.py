"""The final range: the 400 tasks of each held-out split after test, read only by a verdict declared from issue 56
on. Refused at run time without one (config, `run.py check`, `task_range`), and named nowhere else in the source
or configs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.config import ConfigError, load_config
from pipeline.run import build
from pipeline.run.checks import final_range_problems
from pipeline.run.heldout import heldout_tasks
from pipeline.task_ranges import DEFAULT_SIZES, FINAL, range_bounds, task_range
from pipeline.verdict import load_verdict

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ("heldout_seen", "heldout_unseen")
ENFORCING = {"pipeline/task_ranges.py", "pipeline/config_learner.py", "pipeline/verdict.py", "pipeline/run/checks.py"}
"""The range table and the verdict machinery: the only code that may name the range."""
NAMED = re.compile(r"""["']final["']|\bFINAL\b|ranges\.final""")
VERDICT = 'kind = "seeds"\nseeds = [100]\nfigure = "f"\ngoal = "g"\nrange = "{range}"\n'


def test_final_is_the_next_400_tasks_of_each_split_after_test():
    assert range_bounds(DEFAULT_SIZES)["test"] == (400, 800) and range_bounds(DEFAULT_SIZES)[FINAL] == (800, 1200)
    cfg = load_config(None, [f'eval.range="{FINAL}"', 'eval.verdict="v"', "eval.tasks=400"])
    test_cfg = load_config(None, ['eval.range="test"', "eval.tasks=400"])
    suite = build.suite(cfg)
    final, test = heldout_tasks(cfg, suite), heldout_tasks(test_cfg, suite)
    for split in HELDOUT:
        assert len(final[split]) == 400  # the household splits hold it
        assert [t.task_id for t in final[split]] == [t.task_id for t in list(suite.tasks(split))[800:1200]]
        assert not {t.task_id for t in final[split]} & {t.task_id for t in test[split]}
        signatures = [{suite.spec(t).signature for t in ranges[split]} for ranges in (final, test)]
        assert not signatures[0] & signatures[1]  # no task repeats under another id either


def test_a_run_that_is_not_a_verdicts_is_refused_the_final_range(tmp_path):
    with pytest.raises(ValueError, match="read only by a declared verdict"):
        task_range([], FINAL, DEFAULT_SIZES)
    with pytest.raises(ConfigError, match="read only by a declared verdict's runs"):
        load_config(None, [f'eval.range="{FINAL}"'])
    with pytest.raises(ConfigError, match="never look at the test range"):
        load_config(None, [f'eval.curve_range="{FINAL}"'])
    (tmp_path / "reads-test.toml").write_text(VERDICT.format(range="test"))
    (tmp_path / "reads-final.toml").write_text(VERDICT.format(range=FINAL))

    def problems(name: str) -> list[str]:
        cfg = load_config(None, [f'eval.range="{FINAL}"', f'eval.verdict="{name}"'])
        return final_range_problems(cfg, tmp_path)

    assert "no such verdict file" in problems("made-up")[0]
    assert "reads range 'test', not 'final'" in problems("reads-test")[0]
    assert problems("reads-final") == []


def test_a_final_verdict_hands_its_runs_its_name_and_a_verdicts_set_may_not(tmp_path):
    path = tmp_path / "fresh.toml"
    path.write_text(VERDICT.format(range=FINAL))
    verdict = load_verdict(path)
    assert verdict.overrides()[-2:] == [f'eval.range="{FINAL}"', 'eval.verdict="fresh"']
    path.write_text(VERDICT.format(range=FINAL) + 'set = ["eval.verdict=\\"other\\""]\n')
    with pytest.raises(ConfigError, match="sets eval.verdict itself"):
        load_verdict(path)


def _sources() -> list[Path]:
    files = [ROOT / "run.py", *[p for folder in ("pipeline", "stages", "gates", "learner", "bench", "examples")
                                 for p in (ROOT / folder).rglob("*.py")]]
    return [p for p in files if "__pycache__" not in p.parts]


def test_nothing_but_the_range_table_and_the_verdict_machinery_names_the_final_range():
    readers = [str(p.relative_to(ROOT)) for p in _sources()
               if str(p.relative_to(ROOT)) not in ENFORCING and NAMED.search(p.read_text())]
    assert readers == []
    configs = [str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.toml")
               if p.parent.name != "verdicts" and re.search(r"""["']final["']""", p.read_text())]
    assert configs == []  # a preset, an arm or a budget never asks for it; only a verdict file declares it
    assert NAMED.search((ROOT / "pipeline" / "task_ranges.py").read_text())  # the scan sees what it looks for
