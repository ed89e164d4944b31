"""pipeline/run/job.py pieces that need no real policy."""

import pytest
import trio

import pipeline.run.job as job
from pipeline.config import ConfigError, RunConfig, load_config
from pipeline.run import checks
from stages.evaluate import EvalReport


class _Policy:
    def __init__(self) -> None:
        self.versions: list[int] = []

    def load_weights(self, version, state) -> None:
        self.versions.append(version)


async def test_overlapping_periodic_evaluations_take_turns_on_the_one_evaluation_policy(monkeypatch, autojump_clock):
    # With a small eval.every an evaluation can still run when the next update asks for one; both used to
    # start the same policy server ("serve() is already running") and the run failed.
    built: list[_Policy] = []
    running = []

    def build_policy(cfg, suite, **options):
        built.append(_Policy())
        return built[-1]

    async def evaluate_heldout(policy, suite, splits, greedy):
        assert not running, "two evaluations on one policy at once"
        running.append(policy.versions[-1])
        await trio.sleep(5.0)
        running.pop()
        return {"heldout_seen": EvalReport(success=policy.versions[-1] / 10, per_family={}, mean_steps=1.0, episodes=())}

    monkeypatch.setattr(job.build, "policy", build_policy)
    monkeypatch.setattr(job, "evaluate_heldout", evaluate_heldout)
    evaluate = job._periodic_evaluator(RunConfig(), suite=None, splits={"heldout_seen": []}, built=[])
    scores = {}

    async def one(version):
        scores[version] = await evaluate(version, {})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, 1)
        nursery.start_soon(one, 2)
    assert len(built) == 1 and sorted(built[0].versions) == [1, 2]  # Trio starts the two in either order
    assert scores == {1: {"seen": 0.1}, 2: {"seen": 0.2}}
    assert trio.current_time() == 10.0  # one after the other


def test_an_unknown_lr_schedule_is_listed_with_the_other_bad_names():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["learner.lr_schedule=stepwise", "learner.aggregation=nope"], extra_checks=[checks.name_checks])
    problems = "\n".join(info.value.problems)
    assert "learner.lr_schedule" in problems and "stepwise" in problems
    assert "learner.aggregation" in problems


async def test_a_policy_built_as_ctrl_c_comes_is_still_closed_by_the_job(monkeypatch, tmp_path):
    """Issue 60: the build finishes just as Ctrl-C comes (the stop is set before the phase reads the result): the
    policy is in `built`, which the job closes, not dropped with the interrupted wait."""
    stop = trio.Event()

    async def build_in_thread(build, close):
        policy = build()
        stop.set()  # Ctrl-C, as the engine's start completes
        return policy

    monkeypatch.setattr(job, "build_in_thread", build_in_thread)
    monkeypatch.setattr(job.build, "policy", lambda cfg, suite, **options: _Policy())
    built: list = []
    with pytest.raises(job.RunInterrupted):
        await job._unless_stopped(stop, tmp_path, job._build_policy, RunConfig(), None, None, built)
    assert len(built) == 1 and isinstance(built[0], _Policy)


async def test_the_warm_start_gives_its_freed_heap_back_before_the_run_goes_on(monkeypatch):
    # Behaviour cloning runs in this process (a thread of build_in_thread): its activations and AdamW state are
    # freed when it returns but glibc kept their pages (RSS 850 MB after a 2-epoch warm start where a cached one
    # holds 280), so the held-out measure and GRPO started from BC's high-water mark (issue 60, item 13).
    calls: list[str] = []

    def build_policy(cfg, suite, **options):
        calls.append("built")
        return _Policy()

    monkeypatch.setattr(job.build, "policy", build_policy)
    monkeypatch.setattr(job, "trim", lambda: calls.append("trimmed") or True)
    built: list = []
    policy, _ = await job._build_policy(RunConfig(), suite=None, checkpoint=None, built=built)
    assert calls == ["built", "trimmed"] and built == [policy]
