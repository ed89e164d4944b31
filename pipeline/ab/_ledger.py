"""Where a run's decoder work went, as the A/B report reads it: the ledger in summary.json when the run wrote
one (`"ledger"`: env steps and tokens by each group's fate, docs/ab.md), else an estimate from what the run
recorded, marked "estimated". Pure functions.

The estimate, for records that predate the ledger:
- trained: `items_trained` (one learner item per env step of a trained group: counted, not estimated);
  with zero-variance groups trained (sync-grpo), the all-fail ones among them are put at group_size x
  env.max_steps env steps each (a failed episode runs to its step limit), taken out of `items_trained` where the
  learner kept their zero-advantage items (`learner.keep_zero_advantage_items`), and the rest counted informative;
- dropped all-fail: `groups_all_fail` dropped groups (when the run dropped zero-variance groups) at
  group_size x env.max_steps env steps each;
- the rest of `env_steps` (all-succeed drops, cuts, unfinished groups and stale turns: the records do not
  separate them) is one fate, `other (not separable)`.
Tokens are split in the same proportions as env steps (the records hold no per-fate token count).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

INFORMATIVE = "trained_informative"
OTHER = "other (not separable)"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def recorded(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run's own ledger, as report figures (None: the run wrote none)."""
    ledger = summary.get("ledger")
    if not isinstance(ledger, Mapping) or not isinstance(ledger.get("fates"), Mapping):
        return None
    fates = {name: {"env_steps": _num(f.get("env_steps")), "tokens": _num(f.get("tokens")), "groups": _num(f.get("groups"))}
             for name, f in ledger["fates"].items() if isinstance(f, Mapping)}
    return {"estimated": False, "fates": fates, "env_steps": _num(ledger.get("env_steps")), "tokens": _num(ledger.get("tokens")),
            "env_steps_per_informative_group": _num(ledger.get("env_steps_per_informative_group")),
            "tokens_per_informative_group": _num(ledger.get("tokens_per_informative_group")),
            "idle": dict(ledger["idle"]) if isinstance(ledger.get("idle"), Mapping) else None}


def estimated(summary: Mapping[str, Any], group_size: int | None, max_steps: int | None,
              zero_items_counted: bool = True) -> dict[str, Any] | None:
    """The fates rebuilt from the summary's counts (module docstring); None when the counts are missing."""
    steps, tokens, trained = _num(summary.get("env_steps")), _num(summary.get("generated_tokens")), _num(summary.get("items_trained"))
    if steps is None or trained is None or not group_size or not max_steps:
        return None
    per_fail_group = float(group_size * max_steps)
    all_fail = _num(summary.get("groups_all_fail")) or 0.0
    drops_zero_var = (_num(summary.get("groups_dropped_zero_variance")) or 0.0) > 0
    informative = _num(summary.get("groups_trained_informative"))
    trained_groups = _num(summary.get("groups_trained"))
    trained_zero_var_groups = max(0.0, (trained_groups or 0.0) - (informative or 0.0))
    trained_fail = 0.0 if drops_zero_var else min(all_fail, trained_zero_var_groups) * per_fail_group
    informative_steps = max(0.0, trained - trained_fail) if zero_items_counted else trained
    trained_fail = min(trained_fail, max(0.0, steps - informative_steps))
    dropped_fail = min(all_fail * per_fail_group if drops_zero_var else 0.0, max(0.0, steps - informative_steps - trained_fail))
    split = {INFORMATIVE: informative_steps, "trained_zero_variance": trained_fail, "dropped_all_fail": dropped_fail}
    split[OTHER] = max(0.0, steps - sum(split.values()))
    share = (tokens / steps) if tokens is not None and steps > 0 else None
    fates = {name: {"env_steps": v, "tokens": None if share is None else v * share, "groups": None} for name, v in split.items()}
    fates[INFORMATIVE]["groups"] = informative
    return {"estimated": True, "fates": fates, "env_steps": steps, "tokens": tokens,
            "env_steps_per_informative_group": steps / informative if informative else None,
            "tokens_per_informative_group": tokens / informative if informative and tokens is not None else None,
            "idle": None}


def run_ledger(summary: Mapping[str, Any], group_size: int | None, max_steps: int | None,
               zero_items_counted: bool = True) -> dict[str, Any] | None:
    """The recorded ledger, else the estimate."""
    return recorded(summary) or estimated(summary, group_size, max_steps, zero_items_counted)


def fate_shares(ledger: Mapping[str, Any] | None) -> dict[str, float | None]:
    """Each fate's share of the run's env steps."""
    if not ledger or not ledger.get("env_steps"):
        return {}
    total = ledger["env_steps"]
    return {name: (f["env_steps"] / total if f.get("env_steps") is not None else None) for name, f in ledger["fates"].items()}
