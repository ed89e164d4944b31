"""Config: defaults load, overrides apply, and every problem is reported at once."""

import pytest

from pipeline.config import ConfigError, RunConfig, dump_toml, load_config, parse_override


def test_defaults_load():
    cfg = load_config()
    assert cfg == RunConfig()
    assert cfg.gate.k is None and cfg.gate.tau is None and cfg.rollout.group_size == 8  # the gate's own defaults apply


def test_overrides_are_typed_from_toml_syntax():
    cfg = load_config(None, ["gate.enabled=false", "gate.tau=0.2", "run.name=ab", "gate.checkpoints=[10, 15]"])
    assert cfg.gate.enabled is False and cfg.gate.tau == 0.2 and cfg.run.name == "ab"
    assert cfg.gate.checkpoints == [10, 15]


def test_every_problem_is_listed_at_once(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[gate]\ntau = "low"\nkk = 3\n[rollout]\ngroup_size = 1\n[nonsense]\nx = 1\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, ["learner.lr=-1"])
    problems = info.value.problems
    assert any(p.startswith("gate.tau") for p in problems)
    assert any(p.startswith("gate.kk: unknown key") for p in problems)
    assert any(p.startswith("nonsense: unknown key") for p in problems)
    assert "rollout.group_size must be >= 2 (GRPO needs a group)" in problems
    assert "learner.lr must be > 0" in problems
    assert len(problems) == 5


def test_range_problems_are_all_listed():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["rollout.group_size=1", "learner.lr=-1", "policy.top_p=0", "rollout.slots=1"])
    text = "\n".join(info.value.problems)
    for fragment in ("rollout.group_size", "learner.lr", "policy.top_p"):
        assert fragment in text


def test_pretrain_ranges_are_checked():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["pretrain.noise=1.0", "pretrain.dagger_rounds=-1", "pretrain.epochs=0"])
    assert info.value.problems == [
        "pretrain.epochs must be >= 1",
        "pretrain.noise must be in [0, 1)",
        "pretrain.dagger_rounds must be >= 0",
    ]


def test_the_kl_stop_names_where_it_is_checked():
    assert load_config(None, ["learner.kl_stop=\"step\""]).learner.kl_stop == "step"
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.kl_stop=\"batch\""])
    assert info.value.problems == ["learner.kl_stop must be 'epoch' or 'step', not 'batch'"]


def test_extra_checks_are_collected_with_the_rest():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.lr=-1"], extra_checks=[lambda cfg: ["env.name: unknown env 'x'"]])
    assert info.value.problems == ["learner.lr must be > 0", "env.name: unknown env 'x'"]


def test_bad_override_syntax():
    with pytest.raises(ConfigError):
        parse_override("novalue")


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.toml")
    (tmp_path / "broken.toml").write_text("[gate\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "broken.toml")


def test_dumped_config_loads_back_identically(tmp_path):
    cfg = load_config(None, ["gate.checkpoints=[10, 12]", "allocator.options={p = 0.5}", "run.name=x"])
    path = tmp_path / "config.toml"
    path.write_text(dump_toml(cfg))
    assert load_config(path) == cfg


def test_tcp_addresses_are_loopback_unless_remote_is_allowed():
    with pytest.raises(ConfigError, match="transport.steps: tcp://0.0.0.0:5555 accepts frames from other hosts"):
        load_config(None, ['transport.steps="tcp://0.0.0.0:5555"'])
    load_config(None, ['transport.steps="tcp://127.0.0.1:5555"'])
    load_config(None, ['transport.events="tcp://*:5556"', "transport.allow_remote=true"])


def test_gate_shortcuts_fold_into_the_gate_options_and_may_not_be_set_twice():
    cfg = load_config(None, ["gate.tau=0.3", "gate.options={window = 4}", 'gate.name="stall"'])
    assert cfg.gate.gate_options() == {"window": 4, "tau": 0.3}  # k left to the gate's own default
    with pytest.raises(ConfigError) as info:
        load_config(None, ["gate.k=5", "gate.options={k = 6}"])
    assert info.value.problems == ["gate.k and gate.options.k are both set: keep one"]


def test_step_level_advantage_ranges_are_checked():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.step_weight=-1", "learner.gamma=0"])
    assert info.value.problems == ["learner.step_weight must be >= 0", "learner.gamma must be in (0, 1]"]
    assert load_config(None, ["learner.step_weight=1", "learner.gamma=1"]).learner.step_weight == 1.0


def test_the_weight_average_decay_is_checked():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.ema=1"])
    assert info.value.problems == ["learner.ema must be in [0, 1)"]
    assert load_config(None, ["learner.ema=0.8"]).learner.ema == 0.8


def test_the_lr_floor_is_checked():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.lr_floor=1.5"])
    assert info.value.problems == ["learner.lr_floor must be in [0, 1]"]
    assert load_config(None, ["learner.lr_schedule=linear", "learner.lr_floor=0.1"]).learner.lr_schedule == "linear"


def test_a_stage_in_a_process_of_its_own_needs_processes_mode():
    stage = 'stages=[{target = "tests.plugin_stages:Recorder", process = true}]'
    with pytest.raises(ConfigError, match=r"stages\[0\].process = true needs transport.mode"):
        load_config(None, [stage])
    assert load_config(None, [stage, "transport.mode=processes"]).stages[0].process


def test_the_off_clock_curve_needs_kept_weights_and_tasks_to_measure_them_on():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["eval.curve_off_clock=true"])
    assert any("eval.curve_off_clock needs run.keep_weights_every > 0" in p for p in info.value.problems)
    with pytest.raises(ConfigError, match="eval.curve_off_clock needs"):
        load_config(None, ["eval.curve_off_clock=true", "run.keep_weights_every=2", "eval.tasks=0"])
    assert load_config(None, ["eval.curve_off_clock=true", "run.keep_weights_every=2"]).eval.curve_off_clock
