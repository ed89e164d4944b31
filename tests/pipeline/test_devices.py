"""`policy.device` / `learner.device`: their forms, CUDA that is not there as a config error listed with the
others, and `auto` choosing CUDA only where torch sees it."""

import pytest
import torch

from pipeline.config import ConfigError, load_config
from pipeline.devices import auto_workers, device_problems, resolve_device
from tests.cuda import needs_cuda


def test_device_forms():
    assert device_problems("auto", "policy.device") == []
    assert device_problems("cpu", "policy.device") == []
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", ""):
        assert device_problems(bad, "learner.device") == [f"learner.device must be auto, cpu, cuda or cuda:N, not {bad!r}"]


def test_auto_is_the_cpu_without_cuda_and_cuda_with_it():
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_cuda_without_cuda_is_a_config_error_listed_with_the_others():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["policy.device=cuda", "learner.device=cuda:1", "learner.bf16=true", "run.updates=0"])
    problems = info.value.problems
    assert any(p.startswith("policy.device = 'cuda' but torch sees no CUDA device") for p in problems)
    assert any(p.startswith("learner.device = 'cuda:1' but torch sees no CUDA device") for p in problems)
    assert "run.updates must be >= 1" in problems


def test_bf16_needs_a_cuda_learner():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.device=cpu", "learner.bf16=true"])
    assert info.value.problems == ["learner.bf16 needs a CUDA learner.device (bf16 autocast is for CUDA)"]
    assert load_config(None, []).learner.device == "auto" and load_config(None, []).policy.device == "auto"


@needs_cuda
def test_cuda_devices_resolve_and_a_missing_index_is_refused():
    assert resolve_device("auto").type == "cuda"
    assert device_problems("cuda", "policy.device") == [] and device_problems("cuda:0", "policy.device") == []
    beyond = f"cuda:{torch.cuda.device_count()}"
    assert device_problems(beyond, "policy.device") == [
        f"policy.device = {beyond!r} but torch sees {torch.cuda.device_count()} CUDA device(s)"
    ]


def test_auto_workers_uses_both_of_two_cores_and_half_of_more():
    assert [auto_workers(cores) for cores in (1, 2, 3, 4, 8, 16, 64)] == [1, 2, 1, 2, 4, 8, 8]
    assert auto_workers(0) == 1  # an empty affinity mask still decodes


def test_policy_workers_takes_a_count_or_auto():
    assert load_config(None, ["policy.workers=auto"]).policy.workers == "auto"
    assert load_config(None, ['policy.workers="auto"']).policy.workers == "auto"
    assert load_config(None, ["policy.workers=3"]).policy.workers == 3
    for bad in ("0", "many"):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"policy.workers={bad}", "policy.temperature=-1"])
        assert "policy.temperature must be >= 0" in str(err.value)  # listed together
        assert "policy.workers" in str(err.value)
