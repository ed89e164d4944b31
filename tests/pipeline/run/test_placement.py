"""Wiring of stages across processes: private ipc addresses, the config's mode check, the wire form of the
learner's reports (weights and trainer state survive the trip)."""

import os
from pathlib import Path

import msgspec
import pytest
import torch

from pipeline.config import ConfigError, RunConfig, load_config
from pipeline.counters import LearnerReport
from pipeline.messages import LearnerUpdated, ReportStream
from pipeline.run import child_reports, placement, stage_children
from stages.rollout import GateIdentity


async def test_inproc_addresses_become_private_ipc_files_only_across_processes():
    threads = RunConfig()
    async with placement.addresses(threads) as t:
        assert t == threads.transport
    cfg = load_config(None, ["transport.mode=processes", 'transport.results="tcp://127.0.0.1:5999"'])
    async with placement.addresses(cfg) as t:
        folder = Path(t.steps.removeprefix("ipc://")).parent
        assert {t.steps, t.control, t.events, t.reports} == {f"ipc://{folder}/{k}" for k in ("steps", "control", "events", "reports")}
        assert t.results == "tcp://127.0.0.1:5999"  # as configured: the same code serves tcp
        assert folder.stat().st_mode & 0o777 == 0o700 and folder.stat().st_uid == os.getuid()
    assert not folder.exists()


def test_an_unknown_mode_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["transport.mode=fibers"])
    assert "transport.mode must be threads or processes" in str(info.value)


async def test_a_learner_report_survives_the_wire():
    sent = []

    class _Socket:
        async def send(self, message):
            sent.append(msgspec.msgpack.decode(msgspec.msgpack.encode(message), type=ReportStream))

    state = {"model": {"w": torch.ones(2)}, "rng": (3, (1, 2), None)}
    await stage_children._WireReports(_Socket()).send(LearnerReport(
        version=2, stats={"learner/loss": 0.5}, train_seconds=1.0, weights={"w": torch.arange(3.0)},
        trainer_state=state, groups_trained=4))
    (frame,) = sent
    assert isinstance(frame, LearnerUpdated) and frame.version == 2 and frame.groups_trained == 4
    assert torch.equal(child_reports.from_bytes(frame.weights)["w"], torch.arange(3.0))
    back = child_reports.from_bytes(frame.trainer_state)
    assert torch.equal(back["model"]["w"], torch.ones(2)) and back["rng"] == (3, (1, 2), None)


class _TouchesAFile:
    """Unpickling this opens (creates) `path`: what a forged pickle payload could do in the training process."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _update(version, weights=None, state=b""):
    weights = child_reports.to_bytes({"w": torch.ones(2)}) if weights is None else weights
    return LearnerUpdated(version=version, stats={}, train_seconds=0.0, groups_trained=2, weights=weights,
                          trainer_state=state)


async def _read_reports(cfg, messages):
    """Run the reports reader of stages placed in children, send it `messages` then the learner's next report
    (version 1) on one socket, and return once that arrived (so every message before it was read)."""
    import trio

    from pipeline.profiling import Profiler
    from pipeline.stage import StageContext
    from pipeline.transport import open_context

    stages = placement.place_stages(cfg, trainer=None, capture_state=True)
    t = msgspec.structs.replace(cfg.transport, reports="inproc://reports")
    async with open_context() as zmq, trio.open_nursery() as nursery:
        await nursery.start(stages.receive_reports, StageContext(zmq=zmq, addresses=t, run_dir=Path("."),
                                                                  profiler=Profiler(enabled=False)))
        push = zmq.socket("push", t.reports, bind=False)
        for message in [*messages, _update(1)]:
            await push.send(message)
        with trio.fail_after(10):
            report = await stages.reports.receive()
        nursery.cancel_scope.cancel()
    return stages, report, zmq.dropped_frames()


async def test_a_forged_learner_report_is_dropped_and_counted_and_runs_no_pickle(tmp_path):
    """Issue 34: weights and trainer state cross the reports socket packed (`pipeline.tensors`), never as a
    pickle: a report whose weights or trainer state is a pickle (raw, or torch.save'd) that would create a
    file is dropped as `bad_tensors`, the file never appears; a report that is not the next version is
    dropped as `version_out_of_order`; the real next one gets through."""
    import io
    import pickle

    touched = tmp_path / "touched"
    saved = io.BytesIO()
    torch.save({"w": _TouchesAFile(touched)}, saved)
    good = child_reports.to_bytes({"w": torch.ones(2)})
    forged = [_update(1, pickle.dumps(_TouchesAFile(touched))), _update(1, saved.getvalue()),
              _update(1, state=saved.getvalue()), _update(1, good[:-3]), _update(3), _update(0)]
    _, report, dropped = await _read_reports(load_config(None, ["transport.mode=processes"]), forged)
    assert report.version == 1 and torch.equal(report.weights["w"], torch.ones(2))
    assert not touched.exists()
    assert dropped["reports"] == {"bad_tensors": 4, "version_out_of_order": 2}


async def test_reports_a_stage_process_cannot_have_sent_are_dropped_and_its_drop_counts_are_added(tmp_path):
    """A second `StageReady`, one of an unknown stage, drop counts of an unknown stage: dropped and counted;
    a stage's `FramesDropped` (its own sockets' drops) joins the run's `dropped_frames`."""
    from pipeline.messages import FramesDropped, StageReady

    cfg = load_config(None, ["transport.mode=processes", "gate.shadow=true"])
    stages, _, dropped = await _read_reports(cfg, [
        StageReady(stage="gate", gate="stall", shadow=True), StageReady(stage="gate", gate="forged"),
        StageReady(stage="stranger"), FramesDropped(stage="stranger", counts={"x": {"y": 1}}),
        FramesDropped(stage="learner", counts={"results": {"bad_token": 3}}),
        FramesDropped(stage="learner", counts={"results": {"bad_token": 5}})])
    assert stages.gate.identity() == GateIdentity("stall", True)  # the first StageReady of the gate, not the forged second
    assert dropped == {"reports": {"unexpected_ready": 2, "unexpected_report": 1},
                       "results": {"bad_token": 5}}  # a stage's last counts, not their sum


async def test_a_learner_drop_and_the_groups_an_update_trained_keep_their_ids_across_processes():
    """A learner in its own process: the runtime's `GroupDropped` and its groups at the learner need the ids."""
    from pipeline.counters import GroupsConsumed

    sent = []

    class _Socket:
        async def send(self, message):
            sent.append(msgspec.msgpack.decode(msgspec.msgpack.encode(message), type=ReportStream))

    wire = stage_children._WireReports(_Socket())
    await wire.send(GroupsConsumed(zero_variance=True, group_id=7, reason="all_succeed"))
    await wire.send(LearnerReport(version=1, stats={}, train_seconds=0.0, weights={"w": torch.ones(2)}, trainer_state=None,
                                  groups_trained=2, group_ids=(3, 5)))
    drop, update = sent
    assert update.group_ids == [3, 5]
    _, first, _ = await _read_reports(load_config(None, ["transport.mode=processes"]), [drop])
    assert first == GroupsConsumed(zero_variance=True, group_id=7, reason="all_succeed")  # as the learner sent it
    import trio

    report = child_reports.ChildReports(trio.open_memory_channel(1)[0])._learner_report(update, None)
    assert report is not None and report.group_ids == (3, 5)


async def test_a_custom_stage_child_gets_no_run_secret_and_cannot_forge_on_the_run_sockets(tmp_path, monkeypatch):
    """Issue 60 (least privilege): a custom stage's child (`process = true`) reads only the unsealed events, so it
    is not given the run's secret: it reports on a socket of its own, sealed with a secret of its own, which takes
    `StageReady` / `FramesDropped` only. What it sends to the run's reports socket (a forged learner report) is
    dropped as `bad_token`; a learner report on its own socket is dropped too; its StageReady gets through."""
    import trio

    from pipeline.messages import FramesDropped, LearnerDropped, StageReady
    from pipeline.profiling import Profiler
    from pipeline.sealing import new_secret
    from pipeline.stage import StageContext
    from pipeline.transport import open_context

    cfg = load_config(None, ["transport.mode=processes", 'stages=[{target = "tests.plugin_stages:SeenToFile", process = true}]'])
    run_secret, specs = new_secret(), []
    stages = placement.place_stages(cfg, None, capture_state=False, secret=run_secret)
    (custom,) = stages.custom

    async def child(child, spec, *, task_status=trio.TASK_STATUS_IGNORED):  # what the custom stage's process can do
        specs.append(spec)
        async with open_context(secret=spec.secret) as own:
            forged = own.socket("push", t.reports, bind=False)  # the run's reports socket, with what it was given
            await forged.send(LearnerDropped(zero_variance=1, cut=0))
            reports = own.socket("push", spec.addresses.reports, bind=False)
            await reports.send(LearnerDropped(zero_variance=2, cut=0))
            await reports.send(FramesDropped(stage=custom.child.stage, counts={"events": {"undecodable": 1}}))
            await reports.send(StageReady(stage=custom.child.stage))
            await child.ready.wait()
            task_status.started()

    monkeypatch.setattr(placement, "launch", child)
    async with placement.addresses(cfg) as t, open_context(secret=run_secret) as zmq, trio.open_nursery() as nursery:
        ctx = StageContext(zmq=zmq, addresses=t, run_dir=tmp_path, profiler=Profiler(enabled=False))
        await nursery.start(stages.receive_reports, ctx)
        with trio.fail_after(20):
            await nursery.start(custom.run, ctx)
            await custom.finished.wait()
            while zmq.dropped_frames().get("reports", {}).get("bad_token", 0) < 1:  # noqa: ASYNC110 - zmq: no event to wait on
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    (spec,) = specs
    assert spec.secret and spec.secret != run_secret and spec.addresses.reports != t.reports
    dropped = zmq.dropped_frames()
    assert dropped["reports"] == {"bad_token": 1}
    assert dropped["custom_reports"] == {"wrong_shape": 1} and dropped["events"] == {"undecodable": 1}
    assert stages.reports.statistics().current_buffer_used == 0  # no GroupsConsumed reached the phase
