"""The ledger of decoder work by fate: every group's env steps and tokens land in exactly one fate."""

import pytest

from pipeline.ledger import FATES, Work, WorkLedger, ledger_table
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus, Turn

COMPLETE, CUT = TrajectoryStatus.COMPLETE, TrajectoryStatus.CUT


def _turn(tokens: int) -> Turn:
    return Turn(prompt_ids=[1], token_ids=[7] * tokens, logprobs=[0.0] * tokens, action="go", policy_version=0)


def _group(gid: int, wins: list[bool], *, steps: int = 3, tokens: int = 2, cut: bool = False, kind: str = "group",
           parent: int | None = None) -> GroupResult:
    status = CUT if cut else COMPLETE
    trajectories = [Trajectory(rollout_index=i, turns=[_turn(tokens)] * steps, reward=float(w), success=w, status=status)
                    for i, w in enumerate(wins)]
    return GroupResult(group_id=gid, task_id="t", trajectories=trajectories, cut=cut, kind=kind, parent=parent,
                       env_steps=steps * len(wins))


def _totals(ledger: WorkLedger) -> tuple[int, int]:
    return sum(w.env_steps for w in ledger.fates.values()), sum(w.tokens for w in ledger.fates.values())


def _figures(ledger: WorkLedger, **kw):
    return ledger.figures(grpo_wall_s=kw.get("wall", 10.0), slots=4, pacer_held_slot_s=kw.get("held", 0.0),
                          busy_slot_s=kw.get("busy", 0.0))


def test_each_group_lands_in_one_fate_where_its_end_is_decided():
    ledger = WorkLedger()
    mixed, all_fail, all_won, cut = _group(0, [True, False]), _group(1, [False, False]), _group(2, [True, True]), \
        _group(3, [False, False], steps=2, cut=True)
    for group in (mixed, all_fail, all_won):
        ledger.answered(ledger.group_finished(group), [group])  # every finished group released for training
    ledger.answered(ledger.group_finished(cut), [])
    assert ledger.fates["cut"] == Work(1, 4, 8)  # decided at once: 2 rollouts x 2 steps x 2 tokens
    ledger.learner_dropped(1)  # the learner's zero-variance filter
    ledger.learner_dropped(2)
    ledger.learner_trained([0], train_seconds=2.0, stale={})
    assert ledger.fates["trained_informative"] == Work(1, 6, 12)
    assert ledger.fates["dropped_all_fail"] == Work(1, 6, 12)
    assert ledger.fates["dropped_all_succeed"] == Work(1, 6, 12)
    assert _totals(ledger) == (22, 44)
    figures = _figures(ledger, held=4.0, busy=20.0)
    assert figures["env_steps"] == 22 and figures["tokens"] == 44
    assert figures["env_steps_per_informative_group"] == 22.0 and figures["tokens_per_informative_group"] == 44.0
    assert figures["cut_at_step"] == {"2": 1}
    assert figures["cut_spent_steps"] == {"mean": 4.0, "median": 4.0, "max": 4}
    assert figures["idle"] == {"learner_waiting": pytest.approx(0.8), "pacer_holding": pytest.approx(0.1),
                               "slot_occupancy": pytest.approx(0.5)}
    assert list(figures["fates"]) == list(FATES)
    assert "| trained_informative | 1 | 6 | 27.3% | 12 | 27.3% |" in ledger_table(figures)


def test_a_trained_zero_variance_group_and_stale_turns_move_to_their_own_fates():
    ledger = WorkLedger()
    informative, flat = _group(0, [True, False]), _group(1, [False, False])
    for group in (informative, flat):
        ledger.answered(ledger.group_finished(group), [group])
    stale = {"learner/items_dropped_stale": 3.0, "learner/tokens_dropped_stale": 6.0,
             "learner/items_dropped_stale_zero_variance": 1.0, "learner/tokens_dropped_stale_zero_variance": 2.0}
    ledger.learner_trained([0, 1], train_seconds=0.0, stale=stale)
    assert ledger.fates["trained_informative"] == Work(1, 4, 8)
    assert ledger.fates["trained_zero_variance"] == Work(1, 5, 10)
    assert ledger.fates["stale"] == Work(0, 3, 6)
    assert _totals(ledger) == (12, 24)


def test_an_allocator_drop_is_decided_by_its_answer_or_by_the_prompt_settling():
    ledger = WorkLedger()
    plain = _group(0, [False, False])
    ledger.answered(ledger.group_finished(plain), [])  # a plain group the allocator did not release: dropped now
    assert ledger.fates["dropped_all_fail"] == Work(1, 6, 12)
    pilot = _group(1, [True, True], kind="pilot")
    ledger.answered(ledger.group_finished(pilot), [])  # held: a commit may follow
    assert ledger.undecided() == Work(1, 6, 12)
    commit = _group(2, [True, False], kind="commit", parent=1)
    merged = _group(1, [True, True, True, False])  # the training group keeps the pilot's id
    ledger.answered(ledger.group_finished(commit), [merged])
    ledger.learner_trained([1], train_seconds=0.0, stale={})
    assert ledger.fates["trained_informative"] == Work(2, 12, 24)  # the pilot's work and the commit's
    skipped = _group(3, [True, True], kind="pilot")
    ledger.answered(ledger.group_finished(skipped), [])
    ledger.prompt_settled(3)  # no commit came: the allocator dropped it
    assert ledger.fates["dropped_all_succeed"] == Work(1, 6, 12)
    explore = _group(4, [False, False], kind="explore")
    ledger.answered(ledger.group_finished(explore), [], dropped=True)  # the allocator said it dropped it: now
    assert ledger.fates["dropped_all_fail"] == Work(2, 12, 24)
    ledger.prompt_settled(0)  # settling a prompt already decided changes nothing
    assert _totals(ledger) == (30, 60)


def test_what_the_run_end_leaves_undecided_is_unfinished_and_a_checkpoint_counts_it_so():
    ledger = WorkLedger()
    waiting, held = _group(0, [True, False]), _group(1, [True, False], kind="explore")
    ledger.answered(ledger.group_finished(waiting), [waiting])  # at the learner
    ledger.answered(ledger.group_finished(held), [])  # in the allocator
    running = Work(2, 5, 9)
    state = ledger.state_dict(running, pacer_held_slot_s=1.0, busy_slot_s=3.0)
    assert state["fates"]["unfinished"] == {"groups": 4, "env_steps": 17, "tokens": 33}
    back = WorkLedger()
    back.load_state_dict(state)
    assert back.figures(grpo_wall_s=1.0, slots=1, pacer_held_slot_s=1.0, busy_slot_s=0.0)["idle"]["pacer_holding"] == 2.0
    ledger.run_ended(running)
    assert ledger.fates["unfinished"] == Work(4, 17, 33)
    assert ledger.undecided() == Work()
    assert _figures(ledger)["env_steps_per_informative_group"] is None  # none trained
    ledger.learner_trained([0], train_seconds=0.0, stale={})  # a report after the end changes nothing
    assert ledger.fates["trained_informative"] == Work()


def test_a_cut_group_the_learner_refused_is_cut_and_a_cut_at_admission_spends_nothing():
    ledger = WorkLedger()
    leaked = _group(0, [True, False])
    ledger.answered(ledger.group_finished(leaked), [leaked])
    ledger.learner_dropped(0, cut=True)
    at_admission = _group(1, [False, False], steps=0, cut=True)
    ledger.answered(ledger.group_finished(at_admission), [])
    assert ledger.fates["cut"] == Work(2, 6, 12)
    assert ledger.cut_at_step == {0: 1}
    assert ledger.cut_spent == [0]
