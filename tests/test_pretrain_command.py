"""`run.py pretrain` closes the policy it built (a vllm engine's processes outlived the command before)."""

from __future__ import annotations

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
