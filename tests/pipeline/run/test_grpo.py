"""The GRPO phase's own figures: rates and occupancy over the rollout window, not the decoders' start, with
the trajectories still running counted."""

import pytest
import trio

from pipeline.profiling import Profiler
from pipeline.run import build
from pipeline.run.checks import load
from pipeline.run.grpo import run_grpo
from pipeline.run.parts import RunParts
from pipeline.rundir import MetricsWriter

START_S = 3.0
WINDOW_S = 4.0
ACT_S = 0.25


class _SlowToServe:
    """The policy, but `serve` takes START_S before it answers (as 8 decoding processes importing torch do),
    and each answer ACT_S (as one decoder batching 64 requests does): a trajectory lasts longer than the phase."""

    def __init__(self, policy):
        self._policy = policy

    def __getattr__(self, name):
        return getattr(self._policy, name)

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED):
        await trio.sleep(START_S)
        await self._policy.serve(task_status=task_status)

    async def act(self, context, **options):
        await trio.sleep(ACT_S)
        return await self._policy.act(context, **options)


def test_occupancy_is_taken_after_the_policy_started(tmp_path):
    cfg = load(None, ["pretrain.enabled=false", "eval.tasks=0", "run.updates=1000", f"run.max_wall_s={WINDOW_S}",
                      "run.progress=false", "policy.workers=1", "rollout.slots=16", "rollout.group_size=4"])
    suite = build.suite(cfg)
    tasks = list(suite.tasks("train"))[: cfg.env.train_tasks]
    policy = _SlowToServe(build.policy(cfg, suite, warm_start=False))
    metrics = MetricsWriter(tmp_path)
    outcome = trio.run(lambda: run_grpo(RunParts(
        cfg=cfg, run_dir=tmp_path, suite=suite, policy=policy, tasks={t.task_id: t for t in tasks},
        allocator=build.allocator(cfg, tasks), trainer=build.trainer(cfg, policy.trainable()),
        profiler=Profiler(enabled=True), metrics=metrics)))
    metrics.close()
    start = outcome.wall_s - outcome.rollout_wall_s
    assert start == pytest.approx(outcome.counters.start_s, abs=1e-3)
    assert start >= START_S  # the policy's start is the phase's start ...
    assert outcome.rollout_wall_s >= WINDOW_S  # ... and the window after it is whole (run.max_wall_s runs from there)
    # trajectories run in the slots their group took, from the moment it took them: over one window the two
    # occupancies agree (over the whole phase the trajectory figure read START_S of starting as idle slots, and
    # counting ended trajectories alone it read the slots of those still running as idle)
    assert outcome.env_steps > 0
    assert outcome.trajectory_slot_occupancy == pytest.approx(outcome.slot_occupancy, rel=0.15)


async def test_the_groups_still_at_the_learner_are_dropped_as_run_ended_before_phase_finished():
    from types import SimpleNamespace

    from pipeline.config import RunConfig
    from pipeline.counters import PhaseCounters
    from pipeline.messages import GroupDropped, PhaseFinished
    from pipeline.run.grpo import _finish

    class _Heldout:
        async def idle(self):
            pass

    events, events_in = trio.open_memory_channel(10)
    counters = PhaseCounters()
    phase = SimpleNamespace(lifecycle=SimpleNamespace(at_learner={4: None, 9: None}), counters=counters, version=2,
                            cfg=RunConfig())
    wiring = SimpleNamespace(phase=phase, heldout=_Heldout(), events=events, stages=SimpleNamespace(custom=[]))
    observers_done = trio.Event()
    observers_done.set()
    await _finish(wiring, "updates", observers_done)
    sent = [events_in.receive_nowait() for _ in range(3)]
    assert sent == [GroupDropped(group_id=4, reason="run_ended"), GroupDropped(group_id=9, reason="run_ended"),
                    PhaseFinished(updates=2, stop_reason="updates")]
    assert counters.groups_dropped_run_ended == 2
