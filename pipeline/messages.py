"""Every message that crosses a stage boundary, in one module.

All messages are frozen, tagged msgspec Structs; each socket carries one union of them and each socket
owner holds one encoder and one typed decoder (see `pipeline.transport`). Schema evolution rule: new
fields go last and carry a default, so an old peer still decodes a new frame.

Unions per stream:

* `StepStream`    rollout stage -> gate stage and observers: group opened, each env step, group closed.
* `ControlStream` gate stage -> rollout stage: cut decisions.
* `ResultStream`  rollout stage -> learner stage and observers: finished groups.
* `LearnerStream` learner -> allocator / observers: weight versions and learner metrics.
* `LearnerInbox`  runtime -> learner stage (results socket): training groups, announced first across processes.
* `ReportStream`  stages in other processes -> runtime (reports socket): ready, learner updates, gate statistics,
  the frames their sockets dropped.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec


class _Message(msgspec.Struct, frozen=True, tag=True, kw_only=True):
    """Base of every wire message (frozen, tagged by class name)."""


class TrajectoryStatus(enum.IntEnum):
    COMPLETE = 0
    """The episode ended by itself: success, failure or the step limit."""
    CUT = 1
    """A gate cancelled the group while this rollout was still running."""
    ERROR = 2
    """The environment or the policy raised; only this trajectory failed."""


class GroupOpened(_Message):
    """A group (one prompt x `size` rollouts) was admitted and its slots are taken."""

    group_id: int
    """Unique in the run, increasing with admission."""
    task_id: str
    size: int
    """Rollouts in the group."""
    policy_version: int
    """The weight version at admission."""
    admitted_at: float
    """Monotonic seconds (trio clock) at admission."""
    kind: str = "group"
    """The allocator's admission kind: group, pilot, explore (a prompt's first stage: gated), or a later
    stage of the same prompt such as commit or rescue (never gated)."""
    parent: int | None = None
    """Group id of the earlier group of the same prompt that a later-stage group extends."""
    family: str = ""
    """The task's family (`Task.family`): prompt-side features a predicting gate reads at admission."""
    split: str = ""
    """The task's split (`Task.split`), e.g. train, heldout_seen, heldout_unseen."""
    features: dict[str, float] = {}
    """The task's numeric features (`Task.features`)."""


class StepEvent(_Message):
    """One environment step of one rollout: the parsed action string is what gates see."""

    group_id: int
    """The group the rollout belongs to."""
    rollout_index: int
    """Which rollout of the group (0..size-1)."""
    step_index: int
    """0-based: the first action of an episode has step_index 0."""
    action: str
    """The action the policy's text was parsed to, as sent to the environment."""
    done: bool
    """The episode ended with this step (success, failure or the step limit)."""
    reward: float
    """Reward accumulated so far in this episode."""
    policy_version: int
    """The weight version that chose the action."""
    admissible: bool = True
    """The action was one of the environment's admissible commands at this step (or none were listed)."""
    new_observation: bool = True
    """The observation this step produced had not been seen before in this episode (False: a loop or a
    no-op such as "Nothing happens.")."""
    logprob: float | None = None
    """The behaviour log-prob of the chosen action (the sum of its tokens' sampling log-probs); None = not
    reported."""
    entropy: float | None = None
    """Entropy (nats) of the step's choice distribution (`ActResult.entropy`); None = the backend cannot tell
    (vLLM returns only the sampled token's log-prob)."""


class RolloutFailed(_Message):
    """A rollout ended with an error (environment or policy raised); its group goes on without it."""

    group_id: int
    rollout_index: int
    error: str


class GroupClosed(_Message):
    """The group's slots were released; `rewards` are final (truncated at the cut for cut groups)."""

    group_id: int
    """The group that ended."""
    rewards: list[float]
    """Per rollout, in `rollout_index` order."""
    cut: bool
    """A gate's cut stopped it (as `GroupResult.cut`)."""
    steps: int
    """Env steps spent by the whole group."""
    complete: list[bool] = []
    """Per rollout: ended by itself (not cut, not failed). Only these rewards are labels. Empty = all."""


class CancelGroup(_Message):
    """A gate's decision to cut a whole group."""

    group_id: int
    """The group to cut."""
    reason: str
    """The decision's `GateDecision.reason`."""
    gate: str
    """The gate's `name`."""
    value: float
    """The measured statistic that triggered the cut (e.g. mean prefix edit distance)."""
    shadow: bool = False
    """True when the gate only records the decision (shadow mode): nothing is cancelled."""
    checkpoint: int = 0
    """The gate's `GateDecision.checkpoint`: the step at which it decided (0: not said)."""


class Turn(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One policy call inside a trajectory: what the learner trains on."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    action: str
    policy_version: int
    admissible: bool = True
    """The parsed action was one of the environment's admissible commands (or none were listed)."""
    choices: list[list[int]] = []
    """The token sequences decoding was constrained to (`policy.options.choose_admissible`); [] = free.
    The learner rebuilds the same constrained distribution from them."""
    reward: float = 0.0
    """The environment's reward for the step this turn's action took."""
    anchor: str = ""
    """A digest of the state the turn acted in (its observation and admissible commands, `state_anchor`):
    turns of one group with equal anchors acted in the same state, which step-level advantages (GiGPO)
    compare. "" = unknown (never grouped)."""
    nucleus: list[int] = []
    """Each token's nucleus size at sampling (`ActResult.nucleus`): the learner scores the token under the
    same number of most likely tokens, so its ratio is 1 at unchanged weights whatever shares its batch.
    [] = not recorded (the learner applies the top-p rule)."""


class Trajectory(msgspec.Struct, frozen=True, kw_only=True):
    """One rollout of a group, as the learner trains on it."""

    rollout_index: int
    """Which rollout of the group (0..n-1; renumbered in a merged group)."""
    turns: list[Turn]
    """One per policy call, i.e. per env step: `len(turns)` is the episode's length in steps."""
    reward: float
    """The episode's reward (accumulated; for a cut rollout, at the cut)."""
    success: bool
    """The environment said the task was done."""
    status: TrajectoryStatus
    """COMPLETE (ended by itself: only these rewards are labels), CUT or ERROR."""
    error: str = ""
    """What raised, for an ERROR trajectory."""


class GroupResult(_Message):
    """A finished group with every trajectory; cut groups are sent too (for accounting), flagged `cut`."""

    group_id: int
    """As its `GroupOpened`'s."""
    task_id: str
    """The prompt's task (`Task.task_id`)."""
    trajectories: list[Trajectory]
    """Every rollout of the group, in `rollout_index` order (a cut group's cut ones with status CUT)."""
    cut: bool
    """A gate's cut stopped at least one of its rollouts: the one way to count cuts (a `CancelGroup` may be a
    shadow decision or arrive after the group ended, and cuts nothing)."""
    cut_reason: str = ""
    """The cutting decision's `GateDecision.reason` ("" when not cut)."""
    gate_value: float | None = None
    """The cutting decision's `GateDecision.value`, the statistic it measured (None when not cut)."""
    wall_s: float = 0.0
    """Seconds from admission to the last rollout's end (or the cut)."""
    kind: str = "group"
    """The admission kind the group ran as (see `GroupOpened.kind`)."""
    parent: int | None = None
    """The group id this one extends (a commit's pilot, a rescue's explore group); None for a first group."""
    env_steps: int = 0
    """Env steps this rollout group spent (counted as they ran: a turn whose env step never ran is not one); a
    group merged by an allocator keeps its first part's (`pipeline/ledger.py` counts rollout groups)."""
    cut_checkpoint: int = 0
    """The cutting decision's `GateDecision.checkpoint`, the step at which the gate cut (0 when not cut)."""


class GroupExpected(_Message):
    """The runtime is about to send training group `group_id` to a learner in another process (the same
    socket, so it arrives first); see `learner.stage`."""

    group_id: int


class WeightsPublished(_Message):
    """The learner published new weights; the policy loads them between batches."""

    version: int
    """The policy version these weights are: the number of learner updates so far (a resumed run counts on)."""
    groups_trained: int
    """Training groups trained in the whole phase so far (cumulative, not this update's)."""
    published_at: float
    """`trio.current_time()` of the runtime when it published them (seconds, for differences only)."""


class GroupDropped(_Message):
    """A training group the learner will never train, on the event stream: the one message that says so.

    Sent when the learner drops it (`reason` "all_fail" / "all_succeed" / "zero_variance": no reward
    variance, `learner.drop_zero_variance`; "cut": a cut group that reached it, refused) and, before
    `PhaseFinished`, for every training group handed to the learner and neither trained nor dropped when
    the phase ended ("run_ended"). A group an allocator keeps back (DAPO's filter, a pilot not committed)
    never becomes a training group: its `GroupResult` is its last message."""

    group_id: int
    """The training group's id (a merged group keeps its first rollout group's)."""
    reason: str
    """One of `pipeline.outcomes.DROP_REASONS`."""


class PhaseFinished(_Message):
    """The last message on the event stream: the GRPO phase ended (stages may finish their work and return)."""

    updates: int
    """Learner updates in the phase (the last `WeightsPublished.version`)."""
    stop_reason: str
    """updates, max_wall_s, target_heldout or interrupted (as `summary.json`'s `stop_reason`)."""


class StageReady(_Message):
    """A child of the run is up (its sockets are open; `pipeline/run/launch.py`'s handshake): the gate or
    learner stage on the reports socket, a decoding worker on its pool's outbox."""

    stage: str
    gate: str = ""
    shadow: bool = False
    """The gate stage: whose cuts it sends."""
    worker: int = 0
    """A decoding worker: its index in the pool."""
    endpoints: dict[str, str] = {}
    """What a stage child bound, by address name, as its peers reach it (the gate's `steps`, the learner's
    `results`): on Ray each binds an ephemeral port of its node."""


class LearnerUpdated(_Message):
    """A learner in another process finished an update (`pipeline.counters.LearnerReport` on the wire)."""

    version: int
    stats: dict[str, float]
    train_seconds: float
    groups_trained: int
    weights: bytes
    """The new policy weights, `pipeline.tensors.pack`ed (never a pickle)."""
    trainer_state: bytes = b""
    """`Trainer.state_dict()`, `pipeline.tensors.pack`ed (empty: not asked for)."""
    group_ids: list[int] = []
    """The training groups the update trained on (`LearnerReport.group_ids`)."""


class LearnerDropped(_Message):
    """A learner in another process dropped a training group (`pipeline.counters.GroupsConsumed`)."""

    zero_variance: bool = False
    cut: bool = False
    group_id: int = -1
    """The training group dropped (-1: not said)."""
    reason: str = ""
    """`GroupDropped.reason`."""


class GateReport(_Message):
    """A gate stage in another process: its statistics and checkpoint counters, sent as they change."""

    statistics: dict[str, int | float | None]
    """Counts stay ints on the wire, so the summary reads them as an in-process gate's."""
    counters: dict[str, Any]
    final: bool = False
    """Its last report, sent once the parent told it to stop (shadow labels settled): the parent reads to it."""


class FramesDropped(_Message):
    """A stage in another process: the frames its own sockets dropped so far, by socket and reason (the
    run's `dropped_frames` adds the last one of each stage)."""

    stage: str
    counts: dict[str, dict[str, int]]


class Metrics(_Message):
    """A flat bag of hierarchical metric keys (e.g. `learner/loss`) from one stage."""

    stage: str
    values: dict[str, float]


class ActRequest(_Message):
    """One `act()` call sent to a decoding worker process (the context as text: the worker builds the prompt)."""

    request_id: int
    task: str
    observation: str
    admissible: list[str]
    history: list[tuple[str, str]]
    greedy: bool
    number: int
    """The request's sampling number (its random stream), assigned by the caller in call order."""


class AbandonRequest(_Message):
    """The caller stopped waiting (its group was cut): drop the request if it has not been decoded yet."""

    request_id: int


class LoadWeights(_Message):
    """New weights for a decoding worker: `weights` is a `pipeline.tensors.pack`ed state dict."""

    version: int
    weights: bytes


class ActReply(_Message):
    """A worker's answer to an `ActRequest` (an empty `error` means success)."""

    request_id: int
    worker: int
    action: str = ""
    text: str = ""
    prompt_ids: list[int] = []
    token_ids: list[int] = []
    logprobs: list[float] = []
    policy_version: int = 0
    choices: list[list[int]] = []
    error: str = ""
    nucleus: list[int] = []
    entropy: float | None = None
    """`ActResult.entropy`."""


StepStream = GroupOpened | StepEvent | RolloutFailed | GroupClosed
ControlStream = CancelGroup
ResultStream = GroupResult
LearnerInbox = GroupResult | GroupExpected
ReportStream = StageReady | LearnerUpdated | LearnerDropped | GateReport | FramesDropped
CustomReportStream = StageReady | FramesDropped
"""What a custom stage's child may say (its own reports socket, sealed with a secret of its own: least privilege)."""
LearnerStream = WeightsPublished | Metrics
WorkerInbox = ActRequest | AbandonRequest | LoadWeights
WorkerOutbox = ActReply | StageReady
AnyMessage = (
    GroupOpened | StepEvent | RolloutFailed | GroupClosed | CancelGroup | GroupResult | WeightsPublished | Metrics | PhaseFinished
    | GroupDropped
)

__all__ = [
    "AbandonRequest",
    "ActReply",
    "ActRequest",
    "AnyMessage",
    "CancelGroup",
    "ControlStream",
    "CustomReportStream",
    "FramesDropped",
    "GateReport",
    "GroupClosed",
    "GroupDropped",
    "GroupExpected",
    "GroupOpened",
    "GroupResult",
    "LearnerDropped",
    "LearnerInbox",
    "LearnerStream",
    "LearnerUpdated",
    "LoadWeights",
    "Metrics",
    "PhaseFinished",
    "ReportStream",
    "ResultStream",
    "RolloutFailed",
    "StageReady",
    "StepEvent",
    "StepStream",
    "Trajectory",
    "TrajectoryStatus",
    "Turn",
    "WeightsPublished",
    "WorkerInbox",
    "WorkerOutbox",
]
