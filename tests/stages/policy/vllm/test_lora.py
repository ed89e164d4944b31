"""LoRA option of the vLLM backend: settings checks, the adapter on the learner, adapters by version on a fake engine."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import trio

from stages.policy.base import AgentContext
from stages.policy.vllm import decode_vllm_options
from stages.policy.vllm._loop import LoopThread
from stages.policy.vllm._lora import LoraSettings, lora_problems
from stages.policy.vllm._prompt import ChatPrompt
from stages.policy.vllm._server import VllmPolicy
from stages.policy.vllm._vllm_api import Sampling

from .fakes import FakeEngine, WordTok, fake_params

CTX = AgentContext("find the mug", "you see a mug 1", ("take mug 1", "look"))
LORA = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))


def test_lora_settings_are_checked_and_map_to_a_vllm_rank() -> None:
    assert lora_problems(0, 16.0, []) == []
    assert len(lora_problems(-1, 0.0, [])) == 1
    assert len(lora_problems(4, 0.0, [])) == 2
    assert [LoraSettings(r, 1.0, ("q_proj",)).engine_max_rank for r in (1, 4, 8, 9, 300)] == [1, 8, 8, 16, 320]
    assert decode_vllm_options({}, 12).lora is None
    opts = decode_vllm_options({"lora_rank": 4, "lora_alpha": 8, "lora_target_modules": ["q_proj", "v_proj"]}, 12)
    assert opts.lora == LORA
    with pytest.raises(ValueError, match="lora_rank"):
        decode_vllm_options({"lora_rank": 1000}, 12)


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread("test-vllm-lora")
    yield thread
    thread.close()


def _lora_policy(loop: LoopThread, engine: FakeEngine) -> VllmPolicy:
    return VllmPolicy(
        loop, engine, ChatPrompt(WordTok()), Sampling(temperature=0.7, top_p=0.95, max_new_tokens=4),
        model_path="/models/base", shapes={"w": (2, 2)}, seed=0, make_params=fake_params, lora=LORA,
        make_lora=lambda name, lora_id, path: (name, lora_id, path),
    )


async def test_each_version_is_a_lora_adapter_that_later_requests_carry(loop: LoopThread) -> None:
    pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")
    engine = FakeEngine()
    policy = _lora_policy(loop, engine)
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        policy.load_weights(1, {"w": torch.ones(2, 2)})  # full weights into a LoRA policy
    adapter = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(4, 8)}
    async with trio.open_nursery() as nursery:
        await nursery.start(policy.serve)
        before = await policy.act(CTX)
        policy.load_weights(1, adapter)
        assert await trio.to_thread.run_sync(policy.wait_synced) == 1
        after = await policy.act(CTX)
        nursery.cancel_scope.cancel()
    (name, lora_id, path), = engine.loras
    assert (name, lora_id) == ("rollcut-v1", 1)
    assert engine.request_loras == [None, engine.loras[0]]  # version 0 = the base model, no adapter
    assert (before.policy_version, after.policy_version) == (0, 1)
    _check_adapter_dir(Path(path))
    policy.close()
    assert not _exists(Path(path))  # adapter directories go with the policy


def _check_adapter_dir(path: Path) -> None:
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (4, 8.0, ["q_proj", "v_proj"])
    assert config["base_model_name_or_path"] == "/models/base"
    assert (path / "adapter_model.safetensors").is_file()


def _exists(path: Path) -> bool:
    return path.exists()


def test_learner_trains_the_adapter_only_and_its_state_reloads() -> None:
    transformers = pytest.importorskip("transformers", reason="the transformers learner needs the vllm environment")
    pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")
    from stages.policy.vllm._learner import CausalLMTrainable
    from stages.policy.vllm._lora import apply_lora, load_adapter_state

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    base = transformers.LlamaForCausalLM(cfg)
    base_state = {k: v.clone() for k, v in base.state_dict().items()}  # before peft wraps its modules
    base_logp = CausalLMTrainable(base, temperature=1.0, top_p=1.0).completion_logprobs([[1, 2]], [[3, 4]]).logprobs
    model = CausalLMTrainable(apply_lora(base, LORA), temperature=1.0, top_p=1.0, lora=LORA)
    names = [n for n, p in model.lm.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names) and len(list(model.parameters())) == len(names)
    fresh = model.completion_logprobs([[1, 2]], [[3, 4]]).logprobs
    assert torch.allclose(fresh, base_logp, atol=1e-6)  # B = 0: a fresh adapter is the base model
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(2):  # B moves on the first step, A's gradient is non-zero from the second
        opt.zero_grad()
        (-model.completion_logprobs([[1, 2]], [[3, 4]]).logprobs.sum()).backward()
        opt.step()
    trained = model.completion_logprobs([[1, 2]], [[3, 4]]).logprobs.detach()
    assert float(trained.sum()) > float(base_logp.detach().sum())
    state = model.state_dict()
    assert state and all(".lora_" in k for k in state)
    fresh_base = transformers.LlamaForCausalLM(cfg)
    fresh_base.load_state_dict(base_state)
    reloaded = CausalLMTrainable(apply_lora(fresh_base, LORA, seed=1), temperature=1.0, top_p=1.0, lora=LORA)
    load_adapter_state(reloaded.lm, state)
    assert torch.allclose(reloaded.completion_logprobs([[1, 2]], [[3, 4]]).logprobs, trained, atol=1e-5)


def test_wrapping_a_model_in_an_adapter_warns_the_user_of_nothing() -> None:
    """peft reads a property transformers deprecated; the FutureWarning is no concern of the run's user."""
    transformers = pytest.importorskip("transformers", reason="the transformers learner needs the vllm environment")
    pytest.importorskip("peft", reason="LoRA needs peft (the lora extra)")
    from stages.policy.vllm._lora import apply_lora

    cfg = transformers.LlamaConfig(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped = apply_lora(transformers.LlamaForCausalLM(cfg), LORA)
    assert any("lora_" in n for n, _ in wrapped.named_parameters())
