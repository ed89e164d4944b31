"""Nothing the run starts outlives it: a policy still being built when Ctrl-C comes (a vLLM engine starting, in
processes of its own) is closed once it exists, on `python run.py`'s Ctrl-C, on its second Ctrl-C and on
`run.py pretrain`'s (issue 60, item 3). The engine is `tests.plugin_faults:engine_policy`, a backend that starts a
process and then takes seconds to be ready, as vLLM's does; the real engine: tests/stages/policy/vllm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from pipeline.run import teardown
from tests.plugin_faults import ENGINE_DIR, ENGINE_MARK
from tests.test_run_integration import ROOT, TINY


def _engines(folder: Path) -> list[int]:
    """Processes of `engine_policy` started for `folder` that are still alive (not zombies)."""
    alive = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if ENGINE_MARK.encode() in argv and str(folder).encode() in argv and state != "Z":
            alive.append(int(proc.name))
    return alive


class _Engine:
    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        self.closed = False

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        self.closed = True


async def test_a_build_cancelled_midway_is_closed_once_it_exists():
    started, release, built = threading.Event(), threading.Event(), []

    def build() -> _Engine:
        engine = _Engine()
        built.append(engine)
        started.set()
        release.wait(30)  # the engine's start: still going when the caller is cancelled
        return engine

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(teardown.build_in_thread, build, _Engine.close)
            await trio.to_thread.run_sync(started.wait)
            scope.cancel()  # Ctrl-C: the wait ends at once
    assert teardown.pending_builds() == 1 and not built[0].closed
    release.set()
    assert await trio.to_thread.run_sync(teardown.wait_for_builds, 30.0)
    assert built[0].closed and built[0].process.poll() is not None


async def test_a_finished_build_is_returned_and_a_failed_one_raises():
    engine = await teardown.build_in_thread(_Engine, _Engine.close)
    assert not engine.closed
    engine.close()

    def fails() -> None:
        raise RuntimeError("no engine")

    with pytest.raises(RuntimeError, match="no engine"):
        await teardown.build_in_thread(fails, lambda _: None)
    assert teardown.pending_builds() == 0


def test_kill_descendants_ends_the_whole_tree(tmp_path):
    """(In a process of its own: in the test's process it would end every child of pytest.)"""
    script = (
        "import subprocess, sys, time\n"
        "from pipeline.run.teardown import kill_descendants\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(600)\", \"{ENGINE_MARK}\", \"{tmp_path}\"]); "
        f"time.sleep(600)', '{ENGINE_MARK}', '{tmp_path}'])\n"
        "time.sleep(3)\n"
        "print(len(kill_descendants()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) >= 2
    deadline = time.monotonic() + 10
    while _engines(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)  # another process: no event to wait on
    assert _engines(tmp_path) == []


def _interrupted(tmp_path: Path, command: list[str], interrupts: int) -> subprocess.CompletedProcess[str]:
    """`run.py` with the engine backend, interrupted `interrupts` times once its engine process exists."""
    folder = tmp_path / "engine"
    folder.mkdir()
    sets = [*TINY, f'run.out="{tmp_path}/runs"', f'policy.cache_dir="{tmp_path}/cache"',
            'policy.backend="tests.plugin_faults:engine_policy"', "policy.workers=1", "policy.options={start_s = 6.0}"]
    proc = subprocess.Popen([sys.executable, "run.py", *command, *[a for s in sets for a in ("--set", s)]], cwd=ROOT,
                            env=os.environ | {ENGINE_DIR: str(folder), "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not list(folder.glob("building-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # another process: no event to wait on
        assert list(folder.glob("building-*")), "the engine never started"
        for _ in range(interrupts):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
@pytest.mark.parametrize(("command", "interrupts", "closed"), [
    ([], 1, True),  # Ctrl-C while the engine starts: closed once started
    ([], 2, False),  # a second Ctrl-C: killed at once
    (["pretrain"], 1, True),
], ids=["run.py", "run.py, Ctrl-C twice", "run.py pretrain"])
def test_ctrl_c_while_the_engine_starts_leaves_no_engine_process(tmp_path, command, interrupts, closed):
    done = _interrupted(tmp_path, command, interrupts)
    assert done.returncode == 130, done.stderr
    assert _engines(tmp_path / "engine") == [], done.stderr
    assert bool(list((tmp_path / "engine").glob("closed-*"))) == closed, done.stderr
