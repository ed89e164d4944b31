"""The GRPO phase's machine-load figures: what other processes took is the machine's busy CPU less the run's
own tree (a child that exited and was reaped included), and a run is flagged only when the load exceeded
its cores because of others."""

from __future__ import annotations

import os

from pipeline.machine_load import LoadWatch, TreeCpu, is_loaded, machine_busy_cpu_s, process_tree_cpu


def _watch(loads, machine, trees, clock):
    loads, machine, trees, clock = iter(loads), iter(machine), iter(trees), iter(clock)
    return LoadWatch(loadavg=lambda: next(loads), machine_cpu=lambda: next(machine), tree_cpu=lambda: next(trees),
                     cores=2, clock=lambda: next(clock))


def test_other_processes_get_the_machine_cpu_the_run_tree_did_not_use():
    root, child = (1, 0.0), (2, 5.0)
    watch = _watch(
        loads=[1.0, 3.0, 5.0],
        machine=[100.0, 160.0],  # 60 CPU-s busy in the window
        trees=[TreeCpu({root: 10.0, child: 1.0}, frozenset({child})),
               TreeCpu({root: 20.0, child: 4.0}, frozenset({child})),
               TreeCpu({root: 30.0}, frozenset(), reaped=9.0)],  # the child exited at 9 CPU-s and was reaped
        clock=[0.0, 10.0],
    )
    watch.start()
    watch.sample()
    watch.sample()
    figures = watch.figures()
    assert figures["run_cpu_s"] == 20.0 + 8.0  # root 10 -> 30, child 1 -> 9 (seen to 4, the rest from reaping)
    assert figures["other_cpu_s"] == 60.0 - 28.0
    assert figures["other_cpu_cores"] == 3.2
    assert (figures["load_1m_min"], figures["load_1m_mean"], figures["load_1m_max"]) == (1.0, 3.0, 5.0)
    assert figures["machine_loaded"] is True


def test_a_run_that_loads_the_machine_by_itself_is_not_flagged():
    assert is_loaded({"load_1m_mean": 3.5, "cores_available": 2, "other_cpu_cores": 0.05}) is False
    assert is_loaded({"load_1m_mean": 1.5, "cores_available": 2, "other_cpu_cores": 1.5}) is False
    assert is_loaded({"load_1m_mean": 3.5, "cores_available": 2, "other_cpu_cores": 1.0}) is True
    assert is_loaded({"load_1m_mean": 3.5, "cores_available": 2, "other_cpu_cores": None}) is True  # no /proc: load decides
    assert is_loaded({}) is None


def test_the_real_sources_read_this_machine():
    busy = machine_busy_cpu_s()
    tree = process_tree_cpu()
    assert busy is None or busy > 0
    assert any(pid == os.getpid() for pid, _ in tree.processes)
