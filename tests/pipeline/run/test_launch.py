"""The one launcher: what a child is given survives the file it travels in, as data only, and stays private."""

import os
import signal
import stat

import msgspec
import pytest
import torch
import trio
import trio.testing

from pipeline.config import load_config
from pipeline.run import child_reports, launch


def test_a_child_spec_carries_the_config_itself_and_the_trainer_state_as_data(tmp_path):
    cfg = load_config(None, ["transport.mode=processes", "gate.tau=0.5", 'stages=[{target="gate", options={gate="stall"}}]'])
    state = {"model": {"w": torch.arange(4.0)}, "rng": (1, (2, 3), None)}
    spec = launch.ChildSpec(role="learner", config=cfg, addresses=cfg.transport, parent=os.getpid(), sys_path=["/x"],
                            secret=b"s" * 32, trainer_state=child_reports.to_bytes(state), version=3, capture_state=True)
    path = tmp_path / "spec.msgpack"
    launch.write_private(path, msgspec.msgpack.encode(spec))
    back = msgspec.msgpack.decode(path.read_bytes(), type=launch.ChildSpec)
    assert back.config == cfg and back.version == 3 and back.secret == b"s" * 32
    assert torch.equal(child_reports.from_bytes(back.trainer_state)["model"]["w"], torch.arange(4.0))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_spec_file_is_decoded_as_its_type_not_run(tmp_path):
    """Bytes that are not a ChildSpec (here: a pickle) fail to decode; nothing they name is imported or called."""
    import pickle

    path = tmp_path / "spec.msgpack"
    launch.write_private(path, pickle.dumps(os.system))
    with pytest.raises(msgspec.DecodeError):
        msgspec.msgpack.decode(path.read_bytes(), type=launch.ChildSpec)
    with pytest.raises(FileExistsError):  # never overwrites: the file is created by its writer only
        launch.write_private(path, b"")


@pytest.mark.parametrize(("role", "nice", "added"), [("decoder", 5, [5]), ("decoder", 0, []), ("learner", 5, [])])
def test_a_decoding_worker_lowers_its_own_priority_by_worker_nice(monkeypatch, role, nice, added):
    cfg = load_config(None, [f"policy.worker_nice={nice}"])
    calls: list[int] = []
    monkeypatch.setattr(launch.os, "nice", calls.append)
    launch.lower_priority(launch.ChildSpec(role=role, config=cfg, addresses=cfg.transport, parent=os.getpid(), sys_path=[]))
    assert calls == added


def test_worker_nice_out_of_range_is_a_config_problem():
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="policy.worker_nice must be in 0..19, got 20"):
        load_config(None, ["policy.worker_nice=20"])


def test_every_role_names_a_serve_function_of_the_run():
    import importlib

    for role, target in launch.ROLES.items():
        module, _, name = target.partition(":")
        assert module.startswith("pipeline.run."), role
        assert callable(getattr(importlib.import_module(module), name)), role


async def test_sigterm_cancels_the_role_so_that_its_cleanup_runs():
    """What the parent's stop does to a child: its role is cancelled (its `finally` runs), not killed mid-way."""
    cleaned = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(launch.stop_on_sigterm, nursery.cancel_scope)
        await trio.testing.wait_all_tasks_blocked()  # the receiver is installed
        os.kill(os.getpid(), signal.SIGTERM)
        try:
            await trio.sleep_forever()
        finally:
            cleaned.append(True)
    assert cleaned
