"""pipeline/run/job.py pieces that need no real policy."""

import pytest
import trio

import pipeline.run.job as job
from pipeline.config import ConfigError, RunConfig, load_config
from pipeline.run import checks


class _Policy:
    def __init__(self) -> None:
        self.versions: list[int] = []

    def load_weights(self, version, state) -> None:
        self.versions.append(version)


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


class _Checkpointer:
    def __init__(self, latest) -> None:
        self.latest = latest


class _Trainer:
    def published(self):
        return {"w": "the trainer's weights now"}


def test_the_saved_policy_is_the_last_counted_update_not_the_trainer_now():
    """The phase can end (its stop rule, its wall budget) while an update runs: the update runs to its end,
    uncounted, and the trainer's weights are then a version past the summary's and the after-measure's."""
    state = {"model": {"w": "version 12"}, "average": None}
    assert job._last_published(_Checkpointer({"version": 12, "trainer": state}), _Trainer()) == {"w": "version 12"}
    state = {"model": {"w": "version 12"}, "average": {"w": "average at 12"}}  # `ema`: the average is what is served
    assert job._last_published(_Checkpointer({"version": 12, "trainer": state}), _Trainer()) == {"w": "average at 12"}
    assert job._last_published(_Checkpointer(None), _Trainer()) == {"w": "the trainer's weights now"}  # no update
