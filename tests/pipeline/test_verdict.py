"""Verdict files: every problem listed at once, the runner's own keys refused, a file counts as declared only
when it is committed as it stands; the committed verdicts of issue 35 load."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.config import ConfigError
from pipeline.verdict import declared_commit, load_verdict, result_paths

ROOT = Path(__file__).resolve().parents[2]


def test_a_bad_verdict_lists_every_problem(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('kind = "ab"\nseeds = [2, 100, 100]\nrange = "dev"\nfigure = ""\ngoal = "x"\nset = ["run.seed=3", "eval.range=\\"dev\\""]\n')
    with pytest.raises(ConfigError) as info:
        load_verdict(path)
    text = str(info.value)
    for fragment in ("a verdict reads the final range", "each once", "new ones, >= 100", "figure is empty",
                     "sets run.seed itself", "sets eval.range itself", "needs arms", "needs a budget"):
        assert fragment in text, fragment
    path.write_text('kind = "seeds"\nseeds = [100]\nfigure = "f"\ngoal = "g"\ntarget_heldout = 0.4\n')
    with pytest.raises(ConfigError, match="are for kind = 'ab'"):
        load_verdict(path)
    path.write_text('kind = "ab"\nseeds = [100]\nfigure = "f"\ngoal = "g"\narms = ["a", "b"]\nbudget = "tiny"\n'
                    'target_heldout = 1.5\neval_every = 0\n')
    with pytest.raises(ConfigError) as info:
        load_verdict(path)
    assert "a held-out success in (0, 1]" in str(info.value) and "eval_every: >= 1" in str(info.value)
    path.write_text('kind = "ab"\nseeds = [100]\nfigure = "f"\ngoal = "g"\narms = ["a", "b"]\nbudget = "tiny"\nto_budget = true\n')
    with pytest.raises(ConfigError, match="to_budget: only with target_heldout"):
        load_verdict(path)


def test_the_committed_verdicts_load_read_test_or_final_and_write_beside_themselves():
    """The issue-35/36 verdicts read test; those declared from issue 56 on read final and pin their task ranges."""
    files = sorted((ROOT / "configs" / "verdicts").glob("*.toml"))
    assert {f.stem for f in files} >= {"learn-preset", "default-run", "stall-gate", "early-gate"}
    for path in files:
        verdict = load_verdict(path)
        assert verdict.problems() == [] and len(verdict.seeds) == 5 and min(verdict.seeds) >= 100
        assert f'eval.range="{verdict.range}"' in verdict.overrides()
        if verdict.range == "final":
            assert verdict.unpinned() == [] and f'eval.verdict="{path.stem}"' in verdict.overrides()
        else:
            assert verdict.range == "test"
        assert result_paths(path) == (path.with_suffix(".result.md"), path.with_suffix(".result.json"))


def test_a_verdict_is_declared_only_when_committed_as_it_stands(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    path = tmp_path / "v.toml"
    path.write_text("seeds = [100]\n")
    assert declared_commit(path) is None  # untracked
    git("add", "v.toml")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "declare")
    commit = declared_commit(path)
    assert commit is not None and len(commit) == 40
    path.write_text("seeds = [101]\n")
    assert declared_commit(path) is None  # changed after it was declared


def test_a_verdict_pins_its_task_ranges_and_checks_its_control_arm_and_screen(tmp_path):
    path = tmp_path / "v.toml"
    path.write_text('kind = "ab"\nseeds = [100]\nfigure = "f"\ngoal = "g"\narms = ["a", "b"]\nbudget = "tiny"\n'
                    'aa_arm = "c"\nscreen = [0.7, 0.1]\nset = ["eval.ranges.test=300"]\n')
    with pytest.raises(ConfigError) as info:
        load_verdict(path)
    text = str(info.value)
    assert "aa_arm 'c' is not one of the arms" in text and "screen = [0.7, 0.1]" in text and "pin the task ranges" in text
    path.write_text('kind = "ab"\nseeds = [100]\nfigure = "f"\ngoal = "g"\narms = ["a", "b"]\nbudget = "tiny"\n'
                    'ranges = {dev = 200, valid = 200, test = 400}\n')
    verdict = load_verdict(path)
    assert verdict.unpinned() == [] and "eval.ranges.dev=200" in verdict.overrides()
    assert verdict.overrides()[-2:] == ['eval.range="test"', 'eval.verdict="v"']
    path.write_text('kind = "seeds"\nseeds = [100]\nfigure = "f"\ngoal = "g"\n')
    assert load_verdict(path).unpinned() != []
