from pathlib import Path

import pytest

from learner.items import build_items
from pipeline.ab._presets import find_presets, flatten, list_presets, load_preset
from pipeline.config import ConfigError, merge_overrides
from pipeline.run.checks import load
from tests.learner.toy_model import BigramModel, toy_group

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
ARMS = list_presets(CONFIGS / "arms")
BUDGETS = list_presets(CONFIGS / "budgets")


def test_the_issue_s_arms_and_budgets_ship():
    assert {"sync-grpo", "async-grpo", "gate", "gate-shadow", "gate-stall-shadow", "dapo", "greso", "pilot-commit", "vip", "aero", "family",
            "composed"} <= {a.name for a in ARMS}
    assert {"tiny", "default"} <= {b.name for b in BUDGETS}
    assert all(p.description for p in ARMS + BUDGETS)


@pytest.mark.parametrize("budget", BUDGETS, ids=lambda p: p.name)
@pytest.mark.parametrize("arm", ARMS, ids=lambda p: p.name)
def test_every_arm_validates_under_every_budget(arm, budget):
    overrides = [*budget.overrides, *arm.overrides]
    if arm.name.endswith("-learn") and budget.name == "tiny" and "gate.enabled=true" in overrides and "gate.k=10" not in overrides:
        with pytest.raises(ConfigError, match="could never fire"):  # a learn-regime gate (K = 20) in 12-step episodes
            load(None, overrides)
        return
    load(None, overrides)


@pytest.mark.parametrize("budget", BUDGETS, ids=lambda p: p.name)
def test_a_budget_sets_no_plugin_s_options(budget):
    """A budget is layered over any config, a user's gate / allocator / stages included: it may size the run but
    set nothing a plugin owns (a gate without a `k` option refused the tiny budget's old `gate.k = 4`)."""
    owned = ("gate.", "allocator.", "stages", "env.options", "trackers")
    assert not [o for o in budget.overrides if o.startswith(owned)], budget.overrides


def test_the_tiny_budget_lets_every_built_in_gate_fire_with_its_own_defaults():
    tiny = next(b for b in BUDGETS if b.name == "tiny")
    for gate in ("prefix_edit_distance", "stall"):
        load(None, [*tiny.overrides, "gate.enabled=true", f'gate.name="{gate}"'])


@pytest.mark.parametrize("budget", BUDGETS, ids=lambda p: p.name)
def test_sync_grpo_is_lockstep_under_every_budget(budget):
    # max_staleness 0: at most B groups outstanding until an update consumes them; zero-variance groups
    # are trained, not dropped (a drop would free budget mid-batch); B x G slots let all B start together.
    sync = next(a for a in ARMS if a.name == "sync-grpo")
    cfg = load(None, [*budget.overrides, *sync.overrides])
    assert cfg.learner.max_staleness == 0
    assert cfg.learner.drop_zero_variance is False
    assert cfg.gate.enabled is False
    assert cfg.rollout.slots >= cfg.learner.batch_groups * cfg.rollout.group_size


@pytest.mark.parametrize("budget", BUDGETS, ids=lambda p: p.name)
def test_sync_grpo_trains_its_zero_variance_groups_turns_as_the_reference_does(budget):
    """Its description says zero-variance groups are trained as in the reference: their turns enter the
    update with zero advantage (diluting it), as configs/reference.toml sets, not dropped as items."""
    sync = next(a for a in ARMS if a.name == "sync-grpo")
    cfg = load(None, [*budget.overrides, *sync.overrides])
    reference = load(str(CONFIGS / "reference.toml"), [])
    for key in ("drop_zero_variance", "keep_zero_advantage_items"):
        assert getattr(cfg.learner, key) == getattr(reference.learner, key), key
    model = BigramModel()
    zero_variance = toy_group(model, 0, [0.0] * cfg.rollout.group_size)
    items, counts = build_items([zero_variance], cfg.learner.adv_eps, keep_zero_advantage=cfg.learner.keep_zero_advantage_items)
    assert len(items) == cfg.rollout.group_size and all(it.advantage == 0.0 for it in items)
    assert "trained" in sync.description and "as in the reference" in sync.description


def test_history_based_allocators_see_prompts_recur_on_the_default_budget():
    cfg = load(None, list(next(b for b in BUDGETS if b.name == "default").overrides))
    trained_groups = cfg.run.updates * cfg.learner.batch_groups
    assert 0 < cfg.env.train_tasks and trained_groups / cfg.env.train_tasks >= 3


def test_flatten_round_trips_through_the_override_merge():
    data = {
        "run": {"name": 'say "hi"\\', "updates": 3, "max_wall_s": 1.5e-3, "progress": False},
        "allocator": {"name": "greso", "options": {"p_easy": 0.3, "nested": {"x": [1, 2]}}},
        "gate": {"checkpoints": [], "options": {}},
        "stages": [{"target": "examples.jsonl_writer:JsonlWriter", "options": {"path": "a.jsonl"}}],
    }
    overrides = flatten(data)
    assert "allocator.options.p_easy=0.3" in overrides  # key by key: other options of the base survive
    assert merge_overrides({}, overrides) == data


def test_unknown_and_repeated_arms_are_all_reported(tmp_path):
    (tmp_path / "a.toml").write_text("# First line\n#   second\n[gate]\nenabled = false\n")
    with pytest.raises(ConfigError) as info:
        find_presets(["a", "nope", "zilch", "a"], tmp_path, "arm")
    text = "\n".join(info.value.problems)
    assert "'nope'" in text and "'zilch'" in text and "known arms: a" in text and "'a' is given twice" in text
    preset = find_presets([str(tmp_path / "a.toml")], tmp_path / "elsewhere", "arm")[0]
    assert (preset.name, preset.overrides, preset.description) == ("a", ("gate.enabled=false",), "First line second")


def test_bad_toml_is_a_config_error(tmp_path):
    (tmp_path / "bad.toml").write_text("[gate\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_preset(tmp_path / "bad.toml")
