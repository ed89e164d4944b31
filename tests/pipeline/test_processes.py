"""Wiring of stages across processes: private ipc addresses, the config's mode check, the wire form of the
learner's reports (weights and trainer state survive the trip)."""

import os
from pathlib import Path

import msgspec
import pytest
import torch

from pipeline import processes
from pipeline.config import ConfigError, RunConfig, load_config
from pipeline.counters import LearnerReport
from pipeline.messages import LearnerUpdated, ReportStream


async def test_inproc_addresses_become_private_ipc_files_only_across_processes():
    threads = RunConfig()
    async with processes.addresses(threads) as t:
        assert t == threads.transport
    cfg = load_config(None, ["transport.mode=processes", 'transport.results="tcp://127.0.0.1:5999"'])
    async with processes.addresses(cfg) as t:
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
    await processes._WireReports(_Socket()).send(LearnerReport(
        version=2, stats={"learner/loss": 0.5}, train_seconds=1.0, weights={"w": torch.arange(3.0)},
        trainer_state=state, groups_trained=4))
    (frame,) = sent
    assert isinstance(frame, LearnerUpdated) and frame.version == 2 and frame.groups_trained == 4
    assert torch.equal(processes._from_bytes(frame.weights)["w"], torch.arange(3.0))
    back = processes._from_bytes(frame.trainer_state)
    assert torch.equal(back["model"]["w"], torch.ones(2)) and back["rng"] == (3, (1, 2), None)
