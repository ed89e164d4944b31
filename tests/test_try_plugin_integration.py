"""docs/plugins.md's "Try your plugin", run as a new user would: the page's `myplugins.py` (a gate, a stage and
an allocator) written to a folder and its command run from there, and the stage's counts of cut, trained and
dropped groups equal `summary.json`'s."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.docs.test_plugins_doc import DOC, plugin_module
from tests.test_run_integration import ROOT


def documented_command() -> list[str]:
    """The page's try-your-plugin command, split as the shell would (`PYTHONPATH=.` kept as an environment)."""
    (line,) = [b.strip() for b in re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S) if "--budget tiny" in b]
    words = shlex.split(line)
    assert words[:3] == ["PYTHONPATH=.", "python", "run.py"], words
    return words[3:]


def _try(folder, *extra):
    (folder / "run.py").symlink_to(ROOT / "run.py")  # "from the folder that holds myplugins.py and run.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([".", str(ROOT)])}
    proc = subprocess.run([sys.executable, "run.py", *documented_command(), "--set", f'run.out="{folder}/runs"', *extra],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = folder / "runs" / "try"
    return json.loads((run / "fates.json").read_text()), json.loads((run / "summary.json").read_text())


def _write_plugins(folder):
    folder.mkdir()
    (folder / "myplugins.py").write_text(plugin_module())


@pytest.mark.slow
def test_the_documented_plugins_run_with_the_documented_command_and_count_as_the_summary(tmp_path):
    folder = tmp_path / "mine"
    _write_plugins(folder)
    fates, summary = _try(folder)
    assert summary["allocator"] == "myplugins:EasiestTasks" and "repeat" in summary["gate"] or "RepeatGate" in summary["gate"]
    assert fates["groups"] > 0 and fates["cut"] > 0  # the action-based gate had something to see, and cut
    assert fates["cut"] == summary["groups_cut"]
    assert fates["trained"] == summary["groups_trained"] > 0
    dropped = fates["dropped"]
    assert sum(dropped.get(r, 0) for r in ("all_fail", "all_succeed", "zero_variance")) == summary["groups_dropped_zero_variance"]
    assert dropped.get("run_ended", 0) == summary["groups_dropped_run_ended"]
    assert fates["mean_episode_steps"] > 0


@pytest.mark.slow
def test_with_the_learner_dropping_zero_variance_groups_the_stage_counts_each_drop(tmp_path):
    """The page's variant: `--set learner.drop_zero_variance=true` (a shorter wall limit here: it runs to it)."""
    folder = tmp_path / "mine"
    _write_plugins(folder)
    fates, summary = _try(folder, "--set", "learner.drop_zero_variance=true", "--set", "run.max_wall_s=10")
    dropped = fates["dropped"]
    assert summary["groups_dropped_zero_variance"] > 0
    assert sum(dropped.get(r, 0) for r in ("all_fail", "all_succeed", "zero_variance")) == summary["groups_dropped_zero_variance"]
    assert dropped.get("run_ended", 0) == summary["groups_dropped_run_ended"]
    assert fates["cut"] == summary["groups_cut"] and fates["trained"] == summary["groups_trained"]


def test_check_builds_the_documented_allocator_and_names_its_constructor_error(tmp_path):
    folder = tmp_path / "mine"
    _write_plugins(folder)
    (folder / "run.py").symlink_to(ROOT / "run.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([".", str(ROOT)])}
    proc = subprocess.run([sys.executable, "run.py", "check", *documented_command(), "--set", "allocator.options.n=999"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "allocator 'myplugins:EasiestTasks': n = 999, but the env has 8 train tasks" in proc.stderr
    assert "Traceback" not in proc.stderr
