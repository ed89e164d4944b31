"""Shared household fixtures: one suite with 500 tasks per split, generated once per test session."""

from __future__ import annotations

import pytest

from stages.envs.household import HouseholdSuite

SPLIT_SIZE = 500


@pytest.fixture(scope="session")
def suite() -> HouseholdSuite:
    return HouseholdSuite(HouseholdSuite.Options(train_size=SPLIT_SIZE, heldout_seen_size=SPLIT_SIZE, heldout_unseen_size=SPLIT_SIZE, expert="searching"))


def first_task(suite: HouseholdSuite, split: str = "train", **wanted):
    """The first task of `split` whose family / features match `wanted` (family=..., feature=value)."""
    for task in suite.tasks(split):
        family = wanted.get("family")
        if family is not None and task.family != family:
            continue
        if all(task.features[key] == value for key, value in wanted.items() if key != "family"):
            return task
    raise LookupError(f"no task in {split} with {wanted}")
