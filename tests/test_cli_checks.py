"""Fail before the expensive part: bad plugin options and a missing games folder are exit 2 from `check`
and from `run.py` itself, with a clear message and no run folder; `profile` on a non-run folder too."""

import os
import subprocess
import sys

import pytest

from tests.test_run_integration import ROOT


@pytest.mark.parametrize("command", ["check", "train"])
def test_bad_plugin_options_fail_before_any_work(tmp_path, command):
    overrides = ["gate.enabled=true", "gate.options.zzz=1", "env.options.bogus=1", "policy.options.layerz=3", f'run.out="{tmp_path}/runs"',
                 'stages=[{target = "examples.jsonl_writer:JsonlGroupWriter", options = {pth = "x"}}]']
    proc = subprocess.run(
        [sys.executable, "run.py", command, *[a for o in overrides for a in ("--set", o)]],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    for fragment in ("gate.options.zzz: unknown option for gate 'stall'",
                     "env.options.bogus: unknown option for env 'household'", "policy.options", "layerz",
                     "stages[0].options.pth: unknown option for stage 'examples.jsonl_writer:JsonlGroupWriter'"):
        assert fragment in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # no partial run folder


def test_missing_textworld_games_folder_is_a_config_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "run.py", "--set", 'env.name="textworld"', "--set", f'env.options={{games_dir = "{tmp_path}/none"}}',
         "--set", f'run.out="{tmp_path}/runs"'],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()


def test_profile_of_a_folder_that_is_not_a_finished_run(tmp_path):
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "config.toml").write_text("")
    for folder, message in ((tmp_path, "not a run folder"), (tmp_path / "started", "has not finished"),
                            (tmp_path / "nothing", "is not a folder")):
        proc = subprocess.run([sys.executable, "run.py", "profile", str(folder)], cwd=ROOT, capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_bad_curve_keys_folder_is_exit_2_and_keys_makes_a_usable_one(tmp_path):
    bad = subprocess.run([sys.executable, "run.py", "check", "--set", f'transport.curve_dir="{tmp_path}/keys"'],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "transport.curve_dir" in bad.stderr and "run.py keys" in bad.stderr, bad.stderr
    made = subprocess.run([sys.executable, "run.py", "keys", f"{tmp_path}/keys"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    good = subprocess.run([sys.executable, "run.py", "check", "--set", f'transport.curve_dir="{tmp_path}/keys"',
                           "--set", 'transport.events="tcp://0.0.0.0:5556"'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert good.returncode == 0, good.stderr  # with keys, a non-loopback bind is allowed
    again = subprocess.run([sys.executable, "run.py", "keys", f"{tmp_path}/keys"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds keys" in again.stderr


def test_ray_address_is_a_shortcut_for_the_placement_keys(capsys):
    pytest.importorskip("ray")
    from run import main

    assert main(["check", "--ray", "auto"]) == 0
    dumped = capsys.readouterr().out
    assert 'launcher = "ray"' in dumped and 'address = "auto"' in dumped


def test_an_allocator_constructor_error_is_one_line_from_check(tmp_path):
    """`check` builds the allocator against the configured env's train tasks: its constructor's error is exit 2,
    one line naming the allocator, before any work (it used to pass `check` and fail after the warm start)."""
    target = "tests.plugin_allocators:NeedsManyTasks"
    proc = subprocess.run([sys.executable, "run.py", "check", "--set", f'allocator.name="{target}"'],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "needs at least" in line]
    assert len(lines) == 1 and f"allocator {target!r}: RuntimeError: needs at least 100000 train tasks" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    fine = subprocess.run([sys.executable, "run.py", "check", "--set", f'allocator.name="{target}"',
                           "--set", "allocator.options.least=1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert fine.returncode == 0, fine.stderr


def test_a_dotted_plugin_path_gets_the_module_colon_attr_hint():
    proc = subprocess.run([sys.executable, "run.py", "check", "--set", 'allocator.name="tests.plugin_allocators.NeedsManyTasks"',
                           "--set", 'gate.name="tests.plugin_gates.Repeats"'], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "'tests.plugin_allocators:NeedsManyTasks'" in proc.stderr and "'tests.plugin_gates:Repeats'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_budget_is_layered_over_the_config_and_under_set():
    """`run.py --budget tiny` (docs/plugins.md's try-your-plugin run): the budget's values over the default config,
    --set over both; an unknown budget lists the known ones (exit 2); resume keeps its folder's config."""
    proc = subprocess.run([sys.executable, "run.py", "check", "--budget", "tiny", "--set", "rollout.slots=12"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    resolved = proc.stdout
    assert "max_steps = 12" in resolved and "slots = 12" in resolved  # the budget's episodes, the user's slots
    assert "choose_admissible = true" in resolved  # the default config's decoding stays under the budget
    unknown = subprocess.run([sys.executable, "run.py", "check", "--budget", "huge"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    assert unknown.returncode == 2 and "budget 'huge'" in unknown.stderr and "tiny" in unknown.stderr, unknown.stderr
    resume = subprocess.run([sys.executable, "run.py", "resume", "runs/x", "--budget", "tiny"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert resume.returncode == 2 and "no --config or --budget" in resume.stderr


def test_an_ab_study_on_the_tiny_budget_takes_a_gate_without_a_k_option(tmp_path):
    """The tiny budget used to set `gate.k = 4`, which a gate without a `k` option refused (`gate.options.k`, a key
    the user never wrote, and no --set could unset it)."""
    proc = subprocess.run([sys.executable, "run.py", "ab", "--dry-run", "--budget", "tiny", "--arms", "async-grpo", "--seeds", "0",
                           "--out", str(tmp_path), "--set", "gate.enabled=true", "--set", 'gate.name="tests.plugin_gates:CutEvenGroups"'],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "async-grpo-s0: to run" in proc.stdout


def _ray_running_here() -> bool:
    from ray._private import services

    return bool(os.environ.get("RAY_ADDRESS") or services.find_gcs_addresses() or services.find_bootstrap_address(None))


def test_ray_auto_without_a_cluster_is_one_line_and_exit_2(tmp_path):
    """The README's `--ray auto` line tried with no `ray start` first: one line naming the two ways on, no run folder."""
    pytest.importorskip("ray")
    if _ray_running_here():
        pytest.skip("a Ray instance runs on this machine: `--ray auto` would join it")
    proc = subprocess.run([sys.executable, "run.py", "--ray", "auto", "--set", "policy.workers=8", "--set", f'run.out="{tmp_path}/runs"'],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no Ray cluster" in lines[0] and "`ray start --head`" in lines[0] and '`--ray ""`' in lines[0]
    assert not (tmp_path / "runs").exists()


def test_the_readme_ray_auto_line_names_both_ways_on():
    line = next(line for line in (ROOT / "README.md").read_text().splitlines() if "run.py --ray auto --set policy.workers=8 " in line)
    assert "ray start --head" in line and '--ray ""' in line
