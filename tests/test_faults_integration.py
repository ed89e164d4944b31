"""Contained faults, injected through test plugins (tests/plugin_faults.py): an env that raises or hangs
fails single trajectories and the run goes on; a dying policy worker, a learner exception and a full disk
stop the run with a message that says which part failed, keeping the last checkpoint."""

import json

import pytest
import trio

from pipeline.progress import Progress
from pipeline.run.checks import load
from pipeline.run.job import RunFailed, RunInterrupted, run_job
from pipeline.run.resume import load_state
from tests import plugin_faults
from tests.test_run_integration import _tiny

FAULTY_ENV = ["pretrain.enabled=false", 'env.name="tests.plugin_faults:FaultySuite"', "eval.tasks=0", "gate.enabled=false"]


async def _run(tmp_path, *extra):
    cfg = load(None, _tiny(tmp_path, "run.name=f", "gate.k=4", *extra))
    return await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))


@pytest.mark.slow
async def test_env_faults_fail_single_trajectories_and_the_run_goes_on(tmp_path):
    # Long enough that some hang outlives its 0.5 s deadline before the run ends (the exact step timing is
    # tests/stages/test_rollout.py::test_a_hanging_step_fails_its_trajectory_at_the_step_timeout).
    result = await _run(tmp_path, *FAULTY_ENV, "env.options={raise_every = 37, hang_every = 53}", "rollout.step_timeout_s=0.5",
                        "run.updates=6", "rollout.max_error_rate=1.0")  # contained faults, not the error-rate stop
    suite = plugin_faults.INSTANCES[-1]
    assert suite.raised >= 1 and suite.hung >= 1
    assert result.summary["learner_updates"] == 6
    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    errors = [e["error"] for e in events if e["event"] == "rollout.trajectory_failed"]
    raised, timed_out = sum("injected env fault" in e for e in errors), sum("TooSlowError" in e for e in errors)
    assert raised >= 1 and timed_out >= 1 and raised + timed_out == len(errors)  # only the injected faults failed
    assert result.summary["trajectories_failed"] == len(errors)  # every failed trajectory counted
    # Faults still in flight when the last update ended were cancelled with their group, not failed:
    assert raised <= suite.raised and timed_out <= suite.hung
    print(f"env faults: {suite.raised} raised, {suite.hung} hung; trajectories failed {result.summary['trajectories_failed']}")


@pytest.mark.slow
async def test_a_dying_policy_worker_stops_the_run_with_a_clear_message(tmp_path):
    with pytest.raises(RunFailed, match=r"the policy server failed: MemoryError: injected: the policy worker died") as info:
        await _run(tmp_path, 'policy.backend="tests.plugin_faults:dying_policy"', "eval.tasks=0",
                   "policy.options={layers = 1, d_model = 32, heads = 2, max_len = 128, max_prompt_tokens = 100, die_after_batches = 5}", "run.updates=20")
    assert "run.py resume" in str(info.value)


@pytest.mark.slow
async def test_a_learner_exception_keeps_the_last_checkpoint(tmp_path):
    plugin_faults.EXPLODING.update(calls=0, after=3)  # update 1 has at most 3 micro-batches: the failure comes later
    with pytest.raises(RunFailed, match=r"the learner failed: FloatingPointError: injected: loss is NaN") as info:
        await _run(tmp_path, *FAULTY_ENV, "env.options={random_reward = true}", 'learner.loss="tests.plugin_faults:exploding_loss"',
                   "run.updates=20")
    state = load_state(tmp_path / "runs" / "f")
    assert state is not None and state["version"] >= 1
    assert f"checkpoint at update {state['version']} kept" in str(info.value)


@pytest.mark.slow
async def test_a_full_disk_on_the_run_folder_is_a_clear_message(tmp_path):
    with pytest.raises(RunFailed, match=r"the disk of the run folder is full \(No space left on device") as info:
        await _run(tmp_path, 'stages=[{target = "tests.plugin_faults:FillDisk"}]')
    print(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["finished", "failed", "interrupted"])
async def test_the_job_closes_every_policy_it_built_however_it_ends(tmp_path, ending):
    """The backend's optional `close()` (vllm shuts its engine down there) runs for the live policy and the
    held-out evaluator's, on a normal exit, on a stage failure and on Ctrl-C (once went dead: it closed a
    name that was never assigned)."""
    plugin_faults.CLOSED.clear()
    plugin_faults.BUILT.clear()
    options = "{layers = 1, d_model = 32, heads = 2, max_len = 128, max_prompt_tokens = 100, bc_eval_tasks = 0%s}"
    sets = ['policy.backend="tests.plugin_faults:closing_policy"', "eval.every=1", "gate.k=4", "run.name=closing"]
    if ending == "finished":
        cfg = load(None, _tiny(tmp_path, *sets, f"policy.options={options % ''}", "run.updates=2"))
        await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    elif ending == "failed":  # the decoder dies during the GRPO phase
        dies = ", die_after_batches = 5"
        cfg = load(None, _tiny(tmp_path, *sets, f"policy.options={options % dies}", "run.updates=50", "eval.tasks=0"))
        with pytest.raises(RunFailed, match="the policy server failed"):
            await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False))
    else:
        stop = plugin_faults.STOPS["closing"] = trio.Event()
        observer = 'stages=[{target = "tests.plugin_faults:StopAfter", options = {key = "closing", updates = 1}}]'
        cfg = load(None, _tiny(tmp_path, *sets, f"policy.options={options % ''}", "run.updates=50", observer))
        with pytest.raises(RunInterrupted):
            await run_job(cfg, progress=Progress(cfg.run.updates, enabled=False), stop=stop)
    assert len(plugin_faults.CLOSED) >= 1
    assert sorted(plugin_faults.CLOSED) == sorted(plugin_faults.BUILT)  # every policy built was closed, each once
    if ending == "finished":
        assert len(plugin_faults.CLOSED) == 2  # the live policy and the periodic evaluator's
