"""`run.py pretrain`: closes the policy it built (a vllm engine's processes outlived the command before), and keeps
its held-out episodes when asked (`--episodes`), to pair by task with a run's."""

from __future__ import annotations

import json

import trio

import run
from pipeline.run.checks import load
from tests import plugin_faults
from tests.test_run_integration import _tiny


def test_pretrain_closes_its_policy(tmp_path, capsys) -> None:
    plugin_faults.CLOSED.clear()
    cfg = load(None, _tiny(tmp_path, 'policy.backend="tests.plugin_faults:closing_policy"', "eval.tasks=2",
                           "env.max_steps=6", "gate.k=4", "run.progress=false"))
    trio.run(run._pretrain, cfg)
    assert len(plugin_faults.CLOSED) == 1
    assert "success" in capsys.readouterr().out


def test_pretrain_keeps_its_episodes_for_pairing_when_asked(tmp_path, capsys) -> None:
    cfg = load(None, _tiny(tmp_path, "eval.tasks=3", "env.max_steps=6", "gate.k=4", "run.progress=false", 'eval.range="valid"'))
    path = tmp_path / "warm.json"
    trio.run(run._pretrain, cfg, str(path))
    data = json.loads(path.read_text())
    assert data["range"] == "valid" and set(data) == {"range", "before"} and data["before"]
    printed = capsys.readouterr().out
    for split, rows in data["before"].items():  # the figures printed are the episodes kept
        assert len(rows) == 3 and all(len(row) == 4 for row in rows)
        assert f"{split}: success {sum(row[2] for row in rows) / 3:.1%} over 3 tasks of the valid range" in printed


def test_episodes_belong_to_pretrain_only(capsys) -> None:
    assert run.main(["check", "--episodes", "warm.json"]) == 2
    assert "--episodes is pretrain's" in capsys.readouterr().err
