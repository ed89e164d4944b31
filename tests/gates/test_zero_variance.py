"""The zero-variance gate: what it never cuts, which labels train it, refits off the loop, and that it learns."""

import json
import random
import threading

import pytest
import trio

from gates import GATES, build_gate
from gates.base import LearningGate
from gates.zero_variance import AdmissionScreen, ZeroVarianceGate, explored
from gates.zero_variance_features import STEP_FEATURES, feature_names
from gates.zero_variance_model import FitSettings, LinearModel
from pipeline import tensors
from pipeline.contracts import Task
from pipeline.messages import GroupOpened, StepEvent

G = 4
TASK_FEATURES = {"size": 1.0}
WIDTH = len(feature_names(sorted(TASK_FEATURES)))


def _always(p_logit: float = 10.0, threshold: float = 0.5) -> dict[int, LinearModel]:
    """Models that give every group p = sigmoid(p_logit) at every checkpoint, with this threshold."""
    model = LinearModel(coef=[0.0] * WIDTH, intercept=p_logit, threshold=threshold)
    return dict.fromkeys([0, 2, 4, 6, 8, 10, 15, 20], model)


def _opened(gate: ZeroVarianceGate, gid: int, family: str = "f", size: int = G) -> None:
    gate.opened(GroupOpened(group_id=gid, task_id=f"t{gid}", size=size, policy_version=0, admitted_at=0.0,
                            family=family, split="train", features=TASK_FEATURES))
    gate.open(gid, size)


def _step(gid: int, r: int, s: int, *, reward: float = 0.0, done: bool = False, stuck: bool = False) -> StepEvent:
    return StepEvent(group_id=gid, rollout_index=r, step_index=s, action="look" if stuck else f"go {r}.{s}",
                     done=done, reward=reward, policy_version=0, admissible=not stuck, new_observation=not stuck,
                     logprob=-0.1 if stuck else -1.5, entropy=0.2 if stuck else 1.5)


def _run(gate: ZeroVarianceGate, gid: int, steps: int, *, stuck: bool = False, winner_at: int | None = None) -> list:
    """Feed `steps` steps of every member (member 0 wins at `winner_at`); returns the decisions made."""
    decisions = []
    for s in range(steps):
        for r in range(G):
            won = r == 0 and winner_at == s
            if r == 0 and winner_at is not None and s > winner_at:
                continue
            d = gate.observe(_step(gid, r, s, reward=1.0 if won else 0.0, done=won or s == steps - 1, stuck=stuck))
            if d is not None:
                decisions.append(d)
    return decisions


def _warm(gate: ZeroVarianceGate, n: int, start: int = 1000) -> None:
    """n labelled groups in the warm-up (each is in the unbiased sample)."""
    for gid in range(start, start + n):
        _opened(gate, gid)
        _run(gate, gid, 3)
        gate.close(gid)
        gate.labelled(gid, [0.0, 1.0, 0.0, 0.0])


def test_registered_built_and_a_learning_gate():
    assert GATES.get("zero_variance") is ZeroVarianceGate
    gate = build_gate("zero_variance", {"min_precision": 0.9, "k": 3})
    assert isinstance(gate, LearningGate)
    assert gate.checkpoints == [2, 3, 4, 6, 8, 10, 15, 20]
    with pytest.raises(ValueError, match="min_precision"):
        build_gate("zero_variance", {"tau": 0.5})


def test_no_cut_before_the_warm_up_even_when_a_model_says_so():
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=5, explore=0.0))
    gate.install(_always())
    _warm(gate, 4)
    _opened(gate, 1)
    assert not any(d.cut for d in _run(gate, 1, 12, stuck=True))


def test_a_group_seen_winning_is_never_cut():
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=1, explore=0.0))
    gate.install(_always())
    _warm(gate, 1)
    _opened(gate, 1)
    decisions = _run(gate, 1, 12, stuck=True, winner_at=0)
    assert decisions and not any(d.cut for d in decisions)
    assert all("won" in d.reason for d in decisions)
    _opened(gate, 2)  # the same stream without the winner is cut at the first checkpoint
    assert [d.cut for d in _run(gate, 2, 12, stuck=True)] == [True]


def test_a_cut_group_never_trains_the_predictor():
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=1, explore=0.0, refit_every=2))
    gate.install(_always())
    _warm(gate, 1)
    rows = {k: len(v) for k, v in gate._data.items()}
    _opened(gate, 7)
    assert _run(gate, 7, 12, stuck=True)[-1].cut
    gate.close(7)
    gate.labelled(7, [0.0, 0.0])  # even if a label came (the gate stage discards cut groups' labels)
    assert gate.unbiased_labels == 1 and {k: len(v) for k, v in gate._data.items()} == rows
    assert not gate._refit_due.is_set()  # the second label would have asked for a refit


def test_an_uncut_group_outside_the_sample_does_not_train_it_either():
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=1, explore=0.0))
    _warm(gate, 1)
    gate.install(_always(p_logit=-10.0))  # never passes its threshold: nothing is cut
    _opened(gate, 8)
    assert not any(d.cut for d in _run(gate, 8, 12, stuck=True))
    gate.close(8)
    gate.labelled(8, [0.0, 0.0, 0.0, 0.0])
    assert gate.unbiased_labels == 1 and gate.labels_unused == 1


def test_the_exploration_sample_is_never_cut():
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=1, explore=0.3, seed=5))
    gate.install(_always())
    _warm(gate, 1)
    sample = [gid for gid in range(60) if explored(5, gid, 0.3)]
    assert 5 < len(sample) < 35  # the hash draws about 30 %
    for gid in range(60):
        _opened(gate, gid)
        cut = any(d.cut for d in _run(gate, gid, 12, stuck=True))
        assert cut == (gid not in sample)
    # and a prompt the admission screen would have skipped, let through by its draw, is never cut either
    task = Task("t", "f", "d", "train", TASK_FEATURES)
    skip, flagged, x = gate.screen(task, 0, draw=0.0)  # draw < explore: overruled
    assert flagged and not skip
    gid = next(g for g in range(100, 200) if not explored(5, g, 0.3))
    gate.admitted(gid, flagged, x)
    _opened(gate, gid)
    assert not any(d.cut for d in _run(gate, gid, 12, stuck=True))
    assert gate.screen(task, 0, draw=0.9)[0]  # draw >= explore: skipped


def test_the_admission_screen_skips_and_marks_what_it_lets_through():
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=1, explore=0.5, seed=3))
    gate.install(_always())
    _warm(gate, 1)
    screen = AdmissionScreen(gate, {"t": Task("t", "f", "d", "train", TASK_FEATURES)}, version=lambda: 0)
    verdicts = [screen.skip("t") for _ in range(200)]
    assert 60 < sum(verdicts) < 140  # about half overruled by the seeded draw
    assert gate.admission_skipped == sum(verdicts) and gate.admission_screened == 200


async def test_the_decision_never_blocks_the_loop_during_a_refit():
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=1, explore=0.0, refit_every=1))
    gate.install(_always())
    fit_started, release = trio.Event(), threading.Event()
    token = trio.lowlevel.current_trio_token()

    def slow_fit(xs, ys, settings: FitSettings):
        trio.from_thread.run_sync(fit_started.set, trio_token=token)
        release.wait()  # holds the worker thread until the loop has decided
        return LinearModel(coef=[0.0] * WIDTH, intercept=-10.0, threshold=0.5)

    gate.fit = slow_fit
    async with trio.open_nursery() as nursery:
        nursery.start_soon(gate.serve)
        _warm(gate, 1)  # the label asks for a refit
        await fit_started.wait()
        assert gate.refitting
        _opened(gate, 1)
        decisions = _run(gate, 1, 4, stuck=True)  # decided on the loop with the old models, meanwhile
        assert [d.cut for d in decisions] == [True]
        done = gate.refit_done
        release.set()
        await done.wait()
        assert gate.refits == 1 and not gate.refitting
        _opened(gate, 2)
        assert not any(d.cut for d in _run(gate, 2, 4, stuck=True))  # the new models
        nursery.cancel_scope.cancel()


def test_it_learns_to_cut_stuck_groups_at_the_target_precision():
    """A stream where stuck groups end all-fail and progressing ones mixed: after the warm-up the gate cuts
    stuck groups and no progressing one, and its live precision on the unbiased sample is reported."""
    gate = ZeroVarianceGate(ZeroVarianceGate.Options(warmup=40, explore=0.2, refit_every=10, min_flagged=5, confidence=0.0))
    rng = random.Random(0)
    cuts = {True: 0, False: 0}
    for gid in range(240):
        stuck = rng.random() < 0.5
        _opened(gate, gid, family="a" if stuck else "b")
        decisions = _run(gate, gid, 12, stuck=stuck)
        gate.close(gid)
        cut = any(d.cut for d in decisions)
        cuts[stuck] += cut
        if not cut:
            gate.labelled(gid, [0.0] * G if stuck else [1.0, 0.0, 0.0, 1.0])
        if gate._refit_due.is_set():
            gate._refit_due = trio.Event()
            gate.refit_now()
    assert cuts[False] == 0 and cuts[True] > 60
    report = gate.report()
    assert report["gate/zv/precision@2"] == 1.0 and report["gate/zv/threshold@2"] is not None
    assert 0 < report["gate/zv/precision_lo@2"] < 1.0 == report["gate/zv/precision_hi@2"]
    assert report["gate/zv/unbiased_labels"] >= 40 and report["gate/zv/labels_unused"] > 0


def test_features_have_one_name_each():
    assert len(feature_names(["size"])) == WIDTH == 3 + 1 + len(STEP_FEATURES)


def test_without_scikit_learn_building_it_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real(name, *a))
    with pytest.raises(ValueError, match="pip install scikit-learn"):
        build_gate("zero_variance", {})


def test_what_it_learned_survives_a_resume_as_plain_data():
    """state_dict -> JSON -> a fresh gate: the same models, live figures, counts and family rates, hence the same
    decisions; nothing in the state is an object (a checkpoint is never unpickled)."""
    options = ZeroVarianceGate.Options(warmup=40, explore=0.2, refit_every=10, min_flagged=5, confidence=0.0)
    gate = ZeroVarianceGate(options)
    rng = random.Random(3)
    for gid in range(160):
        stuck = rng.random() < 0.5
        _opened(gate, gid, family="a" if stuck else "b")
        decisions = _run(gate, gid, 12, stuck=stuck)
        gate.close(gid)
        if not any(d.cut for d in decisions):
            gate.labelled(gid, [0.0] * G if stuck else [1.0, 0.0, 0.0, 1.0])
        if gate._refit_due.is_set():
            gate._refit_due = trio.Event()
            gate.refit_now()
    state = json.loads(json.dumps(gate.state_dict()))  # plain data only
    assert tensors.unpack(tensors.pack(gate.state_dict())) == state  # and the checkpoint's format carries it as it is
    resumed = ZeroVarianceGate(options)
    resumed.load_state_dict(state)
    assert resumed.report() == gate.report() and resumed.warmed_up
    assert resumed.family_success("a") == gate.family_success("a") and len(resumed._data[2]) == len(gate._data[2]) > 0
    for g in (gate, resumed):
        _opened(g, 1000, family="a")
    assert [d.value for d in _run(gate, 1000, 12, stuck=True)] == [d.value for d in _run(resumed, 1000, 12, stuck=True)]
