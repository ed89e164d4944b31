"""The zero-variance gate offline: fitted on recorded groups, scored on others, and started from the file."""

import random

import msgspec

from gates.calibration import RecordedGroup
from gates.zero_variance import SavedModels, ZeroVarianceGate
from gates.zero_variance_offline import fit_offline, replay, score_offline
from pipeline.contracts import Task
from pipeline.messages import StepEvent

G, STEPS = 4, 12


def _group(i: int, stuck: bool, seed: int) -> RecordedGroup:
    events = []
    for s in range(STEPS):
        for r in range(G):
            won = not stuck and r < 2 and s == STEPS - 1
            events.append(StepEvent(group_id=i, rollout_index=r, step_index=s, action="look" if stuck else f"go {r}.{s}",
                                    done=s == STEPS - 1, reward=float(won), policy_version=0, admissible=not stuck,
                                    new_observation=not stuck, logprob=-0.1 if stuck else -1.0, entropy=0.1 if stuck else 1.0))
    rewards = [0.0] * G if stuck else [1.0, 1.0, 0.0, 0.0]
    return RecordedGroup(task_id=f"t{i % 4}", seed=seed, events=events, tokens=[[1] * STEPS for _ in range(G)],
                         rewards=rewards, complete=[True] * G)


def _groups(seed: int, n: int = 80) -> list[RecordedGroup]:
    rng = random.Random(seed)
    return [_group(i, rng.random() < 0.5, seed) for i in range(n)]


TASKS = {f"t{i}": Task(f"t{i}", "f", "d", "train", {"size": float(i)}) for i in range(4)}


def test_fitted_on_one_seed_it_cuts_the_other_seeds_stuck_groups_early(tmp_path):
    options = ZeroVarianceGate.Options(min_flagged=5)
    train, names = replay(_groups(0), TASKS, options)
    assert all(r.label is not None for r in train) and names == ["size"]
    saved = fit_offline(train, names, options)
    assert saved.models[2].threshold is not None
    held = _groups(1)
    replayed, _ = replay(held, TASKS, options)
    scores, total = score_offline(saved, held, replayed)
    stuck = sum(r.label for r in replayed)
    assert scores[2].cut == scores[2].true_positive == stuck  # every stuck group at k = 2, nothing else
    assert scores[2].steps_saved == stuck * G * (STEPS - 2) and total == len(held) * G * STEPS

    path = tmp_path / "zv.json"
    path.write_bytes(msgspec.json.encode(saved))
    assert msgspec.json.decode(path.read_bytes(), type=SavedModels) == saved
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(model=str(path)))
    assert gate._models[2].coef == saved.models[2].coef and gate._models[2].threshold is None  # not before the warm-up


def test_a_gate_started_from_a_file_refits_on_its_rows_and_its_own_sample(tmp_path):
    """The offline rows (recordings cut nothing: unbiased) join every refit's data; the gate's own labels follow."""
    options = ZeroVarianceGate.Options(min_flagged=5)
    train, names = replay(_groups(0), TASKS, options)
    saved = fit_offline(train, names, options)
    assert len(saved.rows[2]) == sum(2 in r.features and r.label is not None for r in train) > 0
    path = tmp_path / "zv.json"
    path.write_bytes(msgspec.json.encode(saved))
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(model=str(path)))
    seen = {}
    gate.fit = lambda xs, ys, settings: seen.setdefault(len(ys), None)  # record the rows each fit gets
    gate.refit_now()
    assert len(saved.rows[2]) in seen  # before any label of its own: the file's rows alone


def test_recorded_groups_replay_under_the_replay_s_own_ids():
    """Recordings keep the ids their run gave the groups; the replay numbers them itself, and still sees every
    checkpoint of every group (it once matched by recorded id and saw almost none)."""
    options = ZeroVarianceGate.Options(min_flagged=5)
    groups = [msgspec.structs.replace(g, events=[msgspec.structs.replace(e, group_id=1000 + i) for e in g.events])
              for i, g in enumerate(_groups(0))]
    replayed, _ = replay(groups, TASKS, options)
    assert sum(2 in r.features for r in replayed) == len(groups)
