"""Every shipped config file validates (names resolve, values in range)."""

from pathlib import Path

import pytest

from pipeline.config import RunConfig
from pipeline.job import load

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_validates(path):
    assert isinstance(load(path, []), RunConfig)


def test_default_toml_is_the_builtin_default():
    path = Path(__file__).resolve().parents[1] / "configs" / "default.toml"
    assert load(path, []) == RunConfig()
