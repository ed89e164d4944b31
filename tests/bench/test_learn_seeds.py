"""bench/learn_seeds.py's table: per-seed rows from summary.json and the mean rise over seeds; reruns of a seed
count once and show their spread; a declared verdict runs exactly its file and writes its result beside it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from . import bench_module


@pytest.fixture(scope="module")
def learn_seeds():
    return bench_module("learn_seeds")


def _run_folder(tmp_path: Path, seed: int, before: tuple[float, float], after: tuple[float, float], name: str = "") -> Path:
    folder = tmp_path / (name or f"learn-s{seed}")
    folder.mkdir()
    summary = {
        "seed": seed,
        "heldout_before": {"heldout_seen": before[0], "heldout_unseen": before[1]},
        "heldout_after": {"heldout_seen": after[0], "heldout_unseen": after[1]},
        "heldout_success_before": sum(before) / 2,
        "heldout_success_after": sum(after) / 2,
        "heldout_tasks_per_split": 200,
        "wall_s": 1700.4,
        "grpo_wall_s": 1500.2,
        "env_steps": 1000 + seed,
        "learner_updates": 40,
        "heldout_curve": [{"iteration": 8, "heldout/mean": sum(after) / 2 + 0.01}] if seed == 0 else [],
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_report_gives_a_row_per_seed_and_the_mean_rise(learn_seeds, tmp_path: Path) -> None:
    folders = [
        _run_folder(tmp_path, 0, (0.20, 0.18), (0.32, 0.30)),  # +12 points
        _run_folder(tmp_path, 1, (0.22, 0.12), (0.30, 0.24)),  # +10 points
        _run_folder(tmp_path, 2, (0.20, 0.20), (0.26, 0.26)),  # +6 points
    ]
    text = learn_seeds.report(folders)
    assert "| 0 | 20.0 → 32.0 | 18.0 → 30.0 | 19.0 → 31.0 | 12.0 | 8: 32.0 | 1700 | 1500 | n/a | 1000 | 40 |" in text
    assert "| 2 | 20.0 → 26.0 | 20.0 → 26.0 | 20.0 → 26.0 | 6.0 | none |" in text
    # rises 12, 10, 6: mean 9.33, sd 3.06, t(0.975, 2) = 4.303: +-7.6
    assert "Mean rise over seeds [0, 1, 2]: +9.3 pp (95 % Student-t interval, n = 3: [+1.7, +16.9])" in text
    assert "bootstrap" not in text


def test_five_seeds_get_a_student_t_interval_with_its_n(learn_seeds, tmp_path: Path) -> None:
    rises = [(0.20, 0.30), (0.22, 0.30), (0.20, 0.26), (0.18, 0.30), (0.25, 0.29)]
    text = learn_seeds.report([_run_folder(tmp_path, s, (b, b), (a, a)) for s, (b, a) in enumerate(rises)])
    assert "(95 % Student-t interval, n = 5: [" in text
    low, high = text.split("n = 5: [")[1].split("]")[0].split(", ")
    assert 3.0 <= float(low) <= float(high) <= 12.0


def test_reruns_of_a_seed_count_once_and_show_their_spread(learn_seeds, tmp_path: Path) -> None:
    folders = [
        _run_folder(tmp_path, 0, (0.20, 0.20), (0.30, 0.30)),  # +10
        _run_folder(tmp_path, 1, (0.20, 0.20), (0.26, 0.26)),  # +6
        _run_folder(tmp_path, 1, (0.20, 0.20), (0.30, 0.30), name="learn-s1-2"),  # seed 1 again: +10
    ]
    text = learn_seeds.report(folders)
    assert "Mean rise over seeds [0, 1]: +9.0 pp (95 % Student-t interval, n = 2: [" in text  # seed 1 = its mean, +8
    assert "Reruns of seed 1: 2 runs, rise +6.0 / +10.0 pp (spread 4.0 pp; the seed counts once, as their mean)." in text


def _verdict(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "verdicts"
    folder.mkdir()
    (folder / "v.toml").write_text(text)
    return folder / "v.toml"


VERDICT = """kind = "seeds"
config = "default"
set = ["eval.tasks=4", 'run.out="{out}"']
seeds = [100, 101]
ranges = {{dev = 200, valid = 200, test = 400}}
figure = "the rise"
goal = "+10 on each seed"
"""


def test_a_verdict_runs_exactly_its_file_and_writes_its_result_beside_it(learn_seeds, tmp_path: Path, monkeypatch) -> None:
    path = _verdict(tmp_path, VERDICT.format(out=tmp_path / "runs"))
    commands = []

    real_run = subprocess.run

    def fake_run(command, cwd=None, **kwargs):  # run.py: writes the summary of the folder it is told to use
        if not str(command[1]).endswith("run.py"):
            return real_run(command, cwd=cwd, **kwargs)  # git, asked for the commit the runs are made at
        commands.append(command)
        sets = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--set")
        seed = int(sets["run.seed"])
        if seed == 101:
            return subprocess.CompletedProcess(command, 1)  # a seed that fails is reported, not hidden
        (tmp_path / "runs").mkdir(exist_ok=True)
        _run_folder(tmp_path / "runs", seed, (0.2, 0.2), (0.3, 0.3), name=json.loads(sets["run.name"]))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(learn_seeds.subprocess, "run", fake_run)
    monkeypatch.setattr(learn_seeds, "declared_commit", lambda p: "c" * 40)
    assert learn_seeds.run_verdict(path) == 0
    assert all('eval.range="test"' in c and "eval.tasks=4" in c for c in commands)  # the file's overrides, the test range
    assert all("eval.ranges.test=400" in c for c in commands)  # the pinned task ranges
    assert all(c[c.index("--config") + 1].endswith("configs/default.toml") for c in commands)  # "default": the default run
    result = json.loads(path.with_suffix(".result.json").read_text())
    assert result["declared_commit"] == "c" * 40 and result["failed_seeds"] == {"101": 1}
    assert result["run_commits"] == {"100": None}  # this run folder records no commit: said, not guessed
    assert result["per_seed"]["100"]["heldout_success_after"] == pytest.approx(0.3)
    text = path.with_suffix(".result.md").read_text()
    assert "* **Goal:** +10 on each seed" in text and "Failed seeds (exit code): 101 (1)." in text
    assert learn_seeds.run_verdict(path) == 2  # a verdict runs once


def test_a_seeds_verdict_applies_its_screening_rule_before_any_seed_runs(learn_seeds, tmp_path: Path, monkeypatch) -> None:
    """Issue 56, item 5 for kind "seeds": each seed's warm start measured on dev (`run.py pretrain`), a seed outside
    the declared rule replaced by the next one up before anything runs, the result naming the seed left out."""
    path = _verdict(tmp_path, VERDICT.format(out=tmp_path / "runs") + "screen = [0.25, 0.5]\n")
    warm = {100: 0.1, 101: 0.3, 102: 0.4}
    trained: list[int] = []
    real_run = subprocess.run

    def fake_run(command, cwd=None, **kwargs):
        if not str(command[1]).endswith("run.py"):
            return real_run(command, cwd=cwd, **kwargs)
        if "pretrain" in command:  # the screening measure, on dev
            cfg = (Path(command[command.index("--config") + 1])).read_text()
            seed = int(next(line for line in cfg.splitlines() if line.startswith("seed = ")).split("=")[1])
            assert 'range = "dev"' in cfg and trained == []  # every measure before any run
            line = f"{100 * warm[seed]:.1f}% over 4 tasks of the dev range"
            return subprocess.CompletedProcess(command, 0, f"heldout_seen: success {line}\nheldout_unseen: success {line}\n", "")
        sets = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--set")
        trained.append(int(sets["run.seed"]))
        (tmp_path / "runs").mkdir(exist_ok=True)
        _run_folder(tmp_path / "runs", int(sets["run.seed"]), (0.2, 0.2), (0.3, 0.3), name=json.loads(sets["run.name"]))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(learn_seeds.subprocess, "run", fake_run)
    monkeypatch.setattr(learn_seeds, "declared_commit", lambda p: "c" * 40)
    assert learn_seeds.run_verdict(path) == 0
    assert trained == [101, 102]
    result = json.loads(path.with_suffix(".result.json").read_text())
    assert result["seeds_run"] == [101, 102] and list(result["screened_out"]) == ["100"]
    assert "100: warm start wins 10.0 % on dev, outside [25 %, 50 %]" in path.with_suffix(".result.md").read_text()


def test_a_seeds_verdict_whose_rule_too_few_seeds_pass_runs_nothing(learn_seeds, tmp_path: Path, monkeypatch, capsys) -> None:
    path = _verdict(tmp_path, VERDICT.format(out=tmp_path / "runs") + "screen = [0.9, 1.0]\n")
    real_run = subprocess.run

    def fake_run(command, cwd=None, **kwargs):
        if not str(command[1]).endswith("run.py"):
            return real_run(command, cwd=cwd, **kwargs)
        assert "pretrain" in command, "no seed may run"
        return subprocess.CompletedProcess(command, 0, "heldout_seen: success 20.0% over 4\n", "")

    monkeypatch.setattr(learn_seeds.subprocess, "run", fake_run)
    monkeypatch.setattr(learn_seeds, "declared_commit", lambda p: "c" * 40)
    assert learn_seeds.run_verdict(path) == 2
    assert "screening: only 0 of 10 seeds tried passed" in capsys.readouterr().err
    assert not path.with_suffix(".result.md").exists()


def test_a_verdict_not_committed_as_it_stands_is_refused(learn_seeds, tmp_path: Path, monkeypatch) -> None:
    path = _verdict(tmp_path, VERDICT.format(out=tmp_path / "runs"))
    monkeypatch.setattr(learn_seeds, "declared_commit", lambda p: None)
    assert learn_seeds.run_verdict(path) == 2
    assert not path.with_suffix(".result.md").exists()


def test_a_verdict_that_does_not_pin_its_task_ranges_is_refused(learn_seeds, tmp_path: Path, monkeypatch, capsys) -> None:
    path = _verdict(tmp_path, VERDICT.format(out=tmp_path / "runs").replace("ranges = {dev = 200, valid = 200, test = 400}\n", ""))
    monkeypatch.setattr(learn_seeds, "declared_commit", lambda p: "c" * 40)
    assert learn_seeds.run_verdict(path) == 2
    assert "does not pin ranges (eval.ranges" in capsys.readouterr().err


def test_an_interrupted_seed_is_set_aside_and_run_again_a_finished_one_is_kept(learn_seeds, tmp_path: Path, monkeypatch) -> None:
    path = _verdict(tmp_path, VERDICT.format(out=tmp_path / "runs"))
    runs = tmp_path / "runs"
    runs.mkdir()
    interrupted = _run_folder(runs, 100, (0.2, 0.2), (0.3, 0.3), name="verdict-v-s100")  # Ctrl-C wrote a summary too
    summary = json.loads((interrupted / "summary.json").read_text()) | {"stop_reason": "interrupted", "heldout_success_after": None}
    (interrupted / "summary.json").write_text(json.dumps(summary))
    _run_folder(runs, 101, (0.2, 0.2), (0.4, 0.4), name="verdict-v-s101")
    seeds = []
    real_run = subprocess.run

    def fake_run(command, cwd=None, **kwargs):
        if not str(command[1]).endswith("run.py"):
            return real_run(command, cwd=cwd, **kwargs)
        sets = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--set")
        seeds.append(int(sets["run.seed"]))
        _run_folder(runs, seeds[-1], (0.2, 0.2), (0.3, 0.3), name=json.loads(sets["run.name"]))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(learn_seeds.subprocess, "run", fake_run)
    monkeypatch.setattr(learn_seeds, "declared_commit", lambda p: "c" * 40)
    assert learn_seeds.run_verdict(path) == 0
    assert seeds == [100]  # the interrupted seed runs again; the finished one is kept
    assert (runs / "verdict-v-s100.unfinished-1" / "summary.json").is_file()
    result = json.loads(path.with_suffix(".result.json").read_text())
    assert result["per_seed"]["100"]["heldout_success_after"] == pytest.approx(0.3)
    assert result["per_seed"]["101"]["heldout_success_after"] == pytest.approx(0.4)


def test_a_seed_the_load_flagged_runs_again_at_most_twice_and_the_result_names_it(learn_seeds, tmp_path: Path, monkeypatch) -> None:
    path = _verdict(tmp_path, VERDICT.format(out=tmp_path / "runs"))
    runs = tmp_path / "runs"
    runs.mkdir()
    loaded = _run_folder(runs, 100, (0.2, 0.2), (0.5, 0.5), name="verdict-v-s100")
    (loaded / "summary.json").write_text(json.dumps(json.loads((loaded / "summary.json").read_text()) | {"machine_loaded": True}))
    seeds = []
    real_run = subprocess.run

    def fake_run(command, cwd=None, **kwargs):  # seed 101's runs are always loaded: it is run again twice, then kept
        if not str(command[1]).endswith("run.py"):
            return real_run(command, cwd=cwd, **kwargs)
        sets = dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--set")
        seeds.append(int(sets["run.seed"]))
        folder = _run_folder(runs, seeds[-1], (0.2, 0.2), (0.3, 0.3), name=json.loads(sets["run.name"]))
        summary = json.loads((folder / "summary.json").read_text()) | {"machine_loaded": seeds[-1] == 101}
        (folder / "summary.json").write_text(json.dumps(summary))
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(learn_seeds.subprocess, "run", fake_run)
    monkeypatch.setattr(learn_seeds, "declared_commit", lambda p: "c" * 40)
    assert learn_seeds.run_verdict(path) == 0
    assert seeds == [100, 101, 101, 101]  # 100 once more (its quiet rerun counts), 101 first and twice again
    result = json.loads(path.with_suffix(".result.json").read_text())
    assert result["per_seed"]["100"]["heldout_success_after"] == pytest.approx(0.3)  # the rerun, not the loaded run
    assert [Path(f).name for f in result["loaded_runs_set_aside"]["101"]] == ["verdict-v-s101.loaded-1", "verdict-v-s101.loaded-2"]
    assert result["per_seed"]["101"]["machine_loaded"] is True  # kept after REDO_LOADED reruns, and named
    assert "verdict-v-s100.loaded-1" in path.with_suffix(".result.md").read_text()


AB_VERDICT = """kind = "ab"
config = "default"
set = ["eval.tasks=4"]
seeds = [100, 101, 102, 103, 104]
arms = ["async-grpo", "gate-stall"]
budget = "tiny"
target_heldout = 0.3
eval_every = 2
to_budget = true
ranges = {dev = 200, valid = 200, test = 400}
aa_arm = "gate-stall"
aa_of = "async-grpo"
screen = [0.1, 0.7]
figure = "time to target"
goal = "gate-stall <= 0.8x"
"""


def test_an_ab_verdict_passes_its_target_rule_and_redoes_loaded_runs(learn_seeds, tmp_path: Path, monkeypatch) -> None:
    path = _verdict(tmp_path, AB_VERDICT)
    commands = []

    def fake_run(command, cwd=None, **kwargs):
        if not str(command[1]).endswith("run.py"):
            return subprocess.CompletedProcess(command, 0, stdout="", stderr="")
        commands.append(command)
        return subprocess.CompletedProcess(command, 1)  # no report: the result says so

    monkeypatch.setattr(learn_seeds.subprocess, "run", fake_run)
    monkeypatch.setattr(learn_seeds, "declared_commit", lambda p: "c" * 40)
    learn_seeds.run_verdict(path)
    (command,) = commands
    assert command[2] == "ab"
    joined = " ".join(command)
    assert "--target-heldout 0.3" in joined and "--eval-every 2" in joined and "--to-budget" in joined
    assert f"--redo-loaded {learn_seeds.REDO_LOADED}" in joined and "--seeds 100,101,102,103,104" in joined
    assert "--aa-arm gate-stall --aa-of async-grpo" in joined and "--screen 0.1:0.7" in joined and "eval.ranges.valid=200" in joined
    assert "wrote no report" in path.with_suffix(".result.md").read_text()


@pytest.mark.parametrize("code", [130, -15], ids=["Ctrl-C", "SIGTERM"])
def test_a_stopped_ab_verdict_writes_no_result_and_can_resume(learn_seeds, tmp_path: Path, monkeypatch, code) -> None:
    """`run.py ab` stopped (Ctrl-C: 130; a signal: negative): no result file, so the same command resumes it (a result
    file would refuse it: a verdict runs once)."""
    path = _verdict(tmp_path, AB_VERDICT)

    def fake_run(command, cwd=None, **kwargs):
        if not str(command[1]).endswith("run.py"):
            return subprocess.CompletedProcess(command, 0, stdout="", stderr="")
        return subprocess.CompletedProcess(command, code)

    monkeypatch.setattr(learn_seeds.subprocess, "run", fake_run)
    monkeypatch.setattr(learn_seeds, "declared_commit", lambda p: "c" * 40)
    assert learn_seeds.run_verdict(path) == 130
    assert not path.with_suffix(".result.md").exists() and not path.with_suffix(".result.json").exists()
