"""The learner drops malformed training groups before they reach the trainer."""

from learner.validation import group_problem
from pipeline.messages import GroupResult, Trajectory, TrajectoryStatus, Turn


def _group(*, logprobs=(-0.1,), reward=1.0, indices=(0, 1), prompt=(1, 2)) -> GroupResult:
    turn = Turn(prompt_ids=list(prompt), token_ids=[3], logprobs=list(logprobs), action="a", policy_version=0)
    return GroupResult(group_id=0, task_id="t", cut=False, trajectories=[
        Trajectory(rollout_index=i, turns=[turn], reward=reward, success=True, status=TrajectoryStatus.COMPLETE) for i in indices
    ])


def test_well_formed_group_passes_and_each_defect_is_caught():
    assert group_problem(_group()) is None
    for bad in (_group(logprobs=()), _group(logprobs=(float("nan"),)), _group(reward=float("inf")),
                _group(indices=(0, 0)), _group(indices=(0, 5)), _group(prompt=(-1,))):
        assert group_problem(bad) == "bad_trajectory"
