"""Every shipped config file validates (names resolve, values in range)."""

import importlib.util
import tomllib
from pathlib import Path

import pytest

from pipeline.config import RunConfig
from pipeline.run.checks import load

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates(path, tmp_path):
    overrides = []
    backend = tomllib.loads(path.read_text()).get("policy", {}).get("backend")
    if backend in ("vllm", "hf"):
        needs = {"vllm": "vllm", "hf": "transformers"}[backend]
        if importlib.util.find_spec(needs) is None:
            pytest.skip(f"a {backend} config validates only where {needs} is installed")
        (tmp_path / "config.json").write_text("{}")  # the model directory its users pass with --set
        overrides = [f'policy.model="{tmp_path}"']
    assert isinstance(load(path, overrides), RunConfig)


def test_base_toml_is_the_builtin_base():
    path = Path(__file__).resolve().parents[1] / "configs" / "base.toml"
    assert load(path, []) == RunConfig()


def test_run_py_without_config_runs_the_default_run(capsys):
    from pipeline.config import dump_toml
    from run import DEFAULT_RUN, main

    assert DEFAULT_RUN == Path(__file__).resolve().parents[1] / "configs" / "default.toml"
    assert main(["check"]) == 0
    assert capsys.readouterr().out.strip() == dump_toml(load(DEFAULT_RUN, [])).strip()
    assert load(DEFAULT_RUN, []) != RunConfig()  # a preset over the base values, not the base values
