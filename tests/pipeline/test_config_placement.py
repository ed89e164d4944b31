"""`[placement]`: the launcher, the decoders' resources and strategy, each problem named at once."""

import importlib.util

import pytest

from pipeline.config import ConfigError, load_config


def test_the_default_launches_locally():
    cfg = load_config(None)
    assert cfg.placement.launcher == "local" and cfg.placement.decoder.num_cpus == 1.0


def test_every_placement_problem_is_listed_at_once():
    with pytest.raises(ConfigError) as info:
        load_config(None, ['placement.launcher="slurm"', 'placement.decoder_strategy="RANDOM"', "placement.ready_timeout_s=0",
                           "placement.decoder={num_cpus = 0, resources = {big = -1}}"])
    problems = info.value.problems
    assert any("placement.launcher must be one of local, ray" in p for p in problems)
    assert any("placement.decoder_strategy must be one of" in p for p in problems)
    assert any("placement.ready_timeout_s" in p for p in problems)
    assert any("placement.decoder.resources.big must be > 0" in p for p in problems)


def test_a_decoder_must_reserve_something():
    with pytest.raises(ConfigError, match="reserves nothing"):
        load_config(None, ["placement.decoder={num_cpus = 0}"])


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the ray extra is not installed")
def test_ray_takes_either_mode_and_checks_the_stages_resources():
    assert load_config(None, ['placement.launcher="ray"']).transport.mode == "threads"  # stages in the coordinator
    cfg = load_config(None, ['placement.launcher="ray"', 'transport.mode="processes"', "placement.stages={resources = {head = 1}}"])
    assert cfg.placement.stages.resources == {"head": 1}  # the gate and learner as actors, on the head
    with pytest.raises(ConfigError, match="placement.stages reserves nothing"):
        load_config(None, ['placement.launcher="ray"', 'transport.mode="processes"', "placement.stages={num_cpus = 0}"])


@pytest.mark.skipif(importlib.util.find_spec("ray") is not None, reason="the ray extra is installed")
def test_ray_without_the_extra_says_how_to_install_it():
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[ray\]'"):
        load_config(None, ['placement.launcher="ray"'])


def test_the_coordinator_is_the_started_process_unless_placed_and_only_on_ray(tmp_path):
    assert load_config(None).placement.coordinator is None
    with pytest.raises(ConfigError) as info:
        load_config(None, ["placement.coordinator={num_cpus = 0}"])
    problems = info.value.problems
    assert "placement.coordinator reserves nothing (num_cpus = num_gpus = 0, no resources): Ray needs one resource to place it" in problems
    assert any("placement.coordinator places the coordinator on Ray: it needs placement.launcher" in p for p in problems)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the ray extra is not installed")
def test_a_placed_coordinator_is_written_to_the_run_folder_and_read_back(tmp_path):
    from pipeline.config import dump_toml

    cfg = load_config(None, ['placement.launcher="ray"', "placement.coordinator={num_cpus = 1, resources = {head = 1}}"])
    (tmp_path / "config.toml").write_text(dump_toml(cfg))
    assert load_config(tmp_path / "config.toml").placement.coordinator == cfg.placement.coordinator
    (tmp_path / "default.toml").write_text(dump_toml(load_config(None)))
    assert load_config(tmp_path / "default.toml").placement.coordinator is None  # None: left out of the file
