from __future__ import annotations

import msgspec
import pytest
import torch
from structlog.testing import capture_logs

from pipeline.config import PolicySection, PretrainSection
from stages.policy import POLICIES, Policy
from stages.policy.torch_tiny import TorchTinyPolicy, torch_tiny_backend
from tests.stages.policy.fake_suite import FindSuite, RecoveringFindSuite

TINY = {"layers": 1, "d_model": 16, "heads": 2, "max_len": 64, "max_prompt_tokens": 48, "bc_eval_tasks": 4}


def _cfg(tmp_path, **options: object) -> PolicySection:
    return PolicySection(max_new_tokens=8, cache_dir=str(tmp_path), options={**TINY, **options})


PRETRAIN = PretrainSection(demos=8, epochs=1, lr=1e-3, batch_size=8, noise=0.0)  # FindSuite: plain BC


def test_registered_backend_builds_a_policy(tmp_path) -> None:
    build = POLICIES.get("torch_tiny")
    policy = build(_cfg(tmp_path), PretrainSection(enabled=False), FindSuite(), seed=0)
    assert isinstance(policy, TorchTinyPolicy)
    assert isinstance(policy, Policy)
    assert policy.version == 0
    assert list(tmp_path.iterdir()) == []  # no BC, nothing cached


def test_bc_checkpoint_is_cached_and_reused(tmp_path) -> None:
    with capture_logs() as first_logs:
        first = torch_tiny_backend(_cfg(tmp_path), PRETRAIN, FindSuite(), seed=0)
    events = [e["event"] for e in first_logs]
    assert "policy.bc.start" in events
    assert "policy.bc.done" in events
    done = next(e for e in first_logs if e["event"] == "policy.bc.done")
    assert 0.0 <= done["success_heldout_seen"] <= 1.0
    files = list(tmp_path.glob("torch_tiny-find-*.pt"))
    assert len(files) == 1

    with capture_logs() as second_logs:
        second = torch_tiny_backend(_cfg(tmp_path), PRETRAIN, FindSuite(), seed=0)
    assert [e["event"] for e in second_logs if e["event"].startswith("policy.bc")] == ["policy.bc.cache_hit"]
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_cache_key_follows_what_changes_the_weights(tmp_path) -> None:
    torch_tiny_backend(_cfg(tmp_path), PRETRAIN, FindSuite(), seed=0)
    torch_tiny_backend(_cfg(tmp_path, threads=2), PRETRAIN, FindSuite(), seed=0)  # decoding only: same file
    assert len(list(tmp_path.glob("*.pt"))) == 1
    torch_tiny_backend(_cfg(tmp_path, d_model=32), PRETRAIN, FindSuite(), seed=0)
    torch_tiny_backend(_cfg(tmp_path), PRETRAIN, FindSuite(), seed=1)
    torch_tiny_backend(
        _cfg(tmp_path), PretrainSection(demos=8, epochs=2, lr=1e-3, batch_size=8, noise=0.0), FindSuite(), seed=0
    )
    torch_tiny_backend(_cfg(tmp_path), PRETRAIN, FindSuite(max_steps=5), seed=0)  # other demos / suite
    assert len(list(tmp_path.glob("*.pt"))) == 5


def test_bad_options_are_refused_with_a_readable_message(tmp_path) -> None:
    with pytest.raises(ValueError, match="policy.options"):
        torch_tiny_backend(_cfg(tmp_path, layerz=2), PRETRAIN, FindSuite(), seed=0)
    with pytest.raises(ValueError, match="max_len"):
        torch_tiny_backend(_cfg(tmp_path, max_prompt_tokens=60), PRETRAIN, FindSuite(), seed=0)
    with pytest.raises(ValueError, match="choose_by must be 'token' or 'command'"):
        torch_tiny_backend(_cfg(tmp_path, choose_admissible=True, choose_by="word"), PRETRAIN, FindSuite(), seed=0)
    with pytest.raises(ValueError, match="needs choose_admissible"):
        torch_tiny_backend(_cfg(tmp_path, choose_by="command"), PRETRAIN, FindSuite(), seed=0)


def test_choose_by_command_reaches_the_model_and_leaves_the_cached_warm_start_alone(tmp_path) -> None:
    token = torch_tiny_backend(_cfg(tmp_path, choose_admissible=True), PRETRAIN, FindSuite(), seed=0)
    command = torch_tiny_backend(_cfg(tmp_path, choose_admissible=True, choose_by="command"), PRETRAIN, FindSuite(), seed=0)
    assert (token.model.choose_by, command.model.choose_by) == ("token", "command")
    assert command.trainable().choose_by == "command"  # the learner scores what the policy samples
    assert len(list(tmp_path.glob("*.pt"))) == 1  # behaviour cloning never decodes: one warm start for both


def test_dagger_rounds_add_the_states_the_policy_visits(tmp_path) -> None:
    suite = RecoveringFindSuite(per_split=24)
    pretrain = PretrainSection(demos=8, epochs=1, lr=1e-3, batch_size=8, dagger_rounds=2, dagger_tasks=6)
    with capture_logs() as logs:
        torch_tiny_backend(_cfg(tmp_path), pretrain, suite, seed=0)
    done = next(e for e in logs if e["event"] == "policy.bc.done")
    assert len(done["dagger_success"]) == len(done["dagger_losses"]) == 2


def test_dagger_rounds_train_at_their_own_peak_lr(tmp_path, monkeypatch) -> None:
    from stages.policy.torch_tiny import _build

    peaks: list[float] = []
    real = _build.train_bc

    def spy(*args, lr, **kwargs):
        peaks.append(lr)
        return real(*args, lr=lr, **kwargs)

    monkeypatch.setattr(_build, "train_bc", spy)
    pretrain = PretrainSection(demos=8, epochs=1, lr=1e-3, batch_size=8, dagger_rounds=2, dagger_tasks=4, dagger_lr=1e-4)
    torch_tiny_backend(_cfg(tmp_path), pretrain, RecoveringFindSuite(per_split=24), seed=0)
    assert peaks == [1e-3, 1e-4, 1e-4]  # BC, then each DAgger round
    peaks.clear()
    torch_tiny_backend(_cfg(tmp_path / "default"), msgspec.structs.replace(pretrain, dagger_lr=0.0), RecoveringFindSuite(per_split=24), seed=0)
    assert peaks == [1e-3, 1e-3, 1e-3]  # 0 = pretrain.lr


def test_a_dagger_warm_start_is_cached_per_recovering_expert(tmp_path) -> None:
    pretrain = PretrainSection(demos=8, epochs=1, lr=1e-3, batch_size=8, dagger_rounds=1, dagger_tasks=4)
    suite = RecoveringFindSuite(per_split=24)
    torch_tiny_backend(_cfg(tmp_path), pretrain, suite, seed=0)
    suite.recovery = "searching"  # DAgger's labels would come from another expert: another warm start
    torch_tiny_backend(_cfg(tmp_path), pretrain, suite, seed=0)
    assert len(list(tmp_path.glob("*.pt"))) == 2


def test_dagger_needs_a_recovering_expert_and_noise_is_skipped_without_one(tmp_path) -> None:
    with pytest.raises(ValueError, match="pretrain.dagger_rounds needs a suite whose expert acts from any state"):
        torch_tiny_backend(_cfg(tmp_path), PretrainSection(demos=8, epochs=1, dagger_rounds=1), FindSuite(), seed=0)
    with capture_logs() as logs:  # noise (on by default) is skipped with a warning, never an error
        torch_tiny_backend(_cfg(tmp_path), PretrainSection(demos=8, epochs=1, noise=0.2), FindSuite(), seed=0)
    assert any(e["event"] == "policy.bc.noise_ignored" for e in logs)
