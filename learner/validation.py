"""What the learner accepts from the results socket: only the groups the runtime handed it, well formed.

The results socket may receive frames from anyone who can reach it, and a forged `GroupResult` would be
trained on. The runtime announces each training group it sends (`LearnerStage.expect`); a group that was
not announced (or arrives twice) is dropped as `unknown_group`, and a malformed one as `bad_trajectory`.
"""

from __future__ import annotations

import math

from pipeline.messages import GroupResult


def group_problem(group: GroupResult) -> str | None:
    """None if every trajectory of `group` is well formed, else the reason to drop it."""
    indices = [t.rollout_index for t in group.trajectories]
    if len(set(indices)) != len(indices) or any(not 0 <= i < len(indices) for i in indices):
        return "bad_trajectory"
    for trajectory in group.trajectories:
        if not math.isfinite(trajectory.reward):
            return "bad_trajectory"
        for turn in trajectory.turns:
            if len(turn.token_ids) != len(turn.logprobs) or not all(map(math.isfinite, turn.logprobs)):
                return "bad_trajectory"
            if min(turn.prompt_ids + turn.token_ids, default=0) < 0:
                return "bad_trajectory"
    return None
