import json
import sys
import threading
import types

import pytest
import trio

from pipeline.profiling import (
    PLOT_FILE,
    UNATTRIBUTED,
    Profiler,
    load_report,
    validate_trace,
    write_plot_from_trace,
)
from pipeline.profiling._cpu import process_cpu_seconds, thread_cpu_seconds
from pipeline.profiling._gpu import GpuSampler


def _burn(n=20_000):
    return sum(i * i for i in range(n))


async def test_table_for_a_small_trio_program_with_tasks_and_a_bound_thread(tmp_path):
    prof = Profiler(gpu_sample_hz=50.0, cpu_sample_hz=200.0)

    async def rollout():
        for _ in range(5):
            with prof.span("rollout", "env_step"):
                _burn()
                await trio.sleep(0.002)  # spans may contain awaits
            prof.items("rollout")
            prof.gauge("queue/policy_requests", 3)

    async def gate():
        for _ in range(5):
            with prof.wait("gate", "recv"):
                await trio.sleep(0.003)
            with prof.span("gate", "decide"):
                _burn(2000)
            prof.items("gate")
            prof.latency("gate", "decide", 0.001)

    def learner():
        prof.bind_thread("learner")
        _burn(200_000)

    async with prof.sampling():
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(rollout)
            nursery.start_soon(gate)
            nursery.start_soon(trio.to_thread.run_sync, learner)
        await trio.sleep(0.02)  # let the CPU sampler tick at least once

    report = prof.finish()
    assert prof.finish() is report
    rows = {r.stage: r for r in report.rows}
    # Stages in order of their first span (Trio picks which task starts first), bound-only ones after.
    assert sorted(list(rows)[:2]) == ["gate", "rollout"]
    assert list(rows)[2:] == ["learner", UNATTRIBUTED]
    assert rows["rollout"].items == 20
    assert rows["rollout"].spans == 20
    assert 0 < rows["rollout"].busy_pct <= 100
    assert rows["rollout"].cpu_pct > 0
    assert rows["gate"].wait_pct > 0
    assert rows["gate"].p50_ms == pytest.approx(1.0)
    assert rows["gate"].latency_from == "latency"
    assert rows["rollout"].latency_from == "spans"
    assert rows["rollout"].p50_ms >= 2.0
    assert rows["learner"].cpu_pct > 0
    assert rows["learner"].busy_pct == 0.0  # bound, but no busy span
    # No GPU on CI: GPU columns say so and carry no numbers.
    if not prof._gpu.available:
        assert all(r.gpu_pct is None for r in report.rows)
        assert report.table_markdown().count("n/a (no GPU)") >= len(rows)

    table = report.table_markdown()
    assert (
        table.splitlines()[0] == "| stage | busy % | CPU % | GPU % attributed | items/s | p50 ms | p99 ms |"
    )
    assert "| rollout |" in table

    written = prof.write(tmp_path)
    assert {p.name for p in written} >= {"profile.json", "profile_table.json"}
    trace = json.loads((tmp_path / "profile.json").read_text())
    assert validate_trace(trace) == []
    assert any(e["ph"] == "C" and e["name"] == "cpu/process" for e in trace["traceEvents"])
    assert load_report(tmp_path) == report
    assert load_report(tmp_path).table_markdown() == table


def test_busy_is_the_union_of_overlapping_spans_not_their_sum():
    now = [0.0]
    prof = Profiler(gpu_sample_hz=0.0, clock=lambda: now[0], thread_clock=lambda: now[0])
    a, b = prof.span("rollout", "x"), prof.span("rollout", "y")
    now[0] = 1.0
    a.__enter__()
    now[0] = 2.0
    b.__enter__()
    now[0] = 3.0
    a.__exit__(None, None, None)
    now[0] = 4.0
    b.__exit__(None, None, None)
    now[0] = 10.0
    row = prof.finish().row("rollout")
    assert row.busy_pct == pytest.approx(30.0)  # [1, 4] of [0, 10], not 2 + 2 = 4 s
    assert row.cpu_pct == pytest.approx(30.0)  # the fake thread clock advanced 3 s inside spans



def test_a_remote_span_is_busy_time_without_the_calling_threads_cpu():
    now = [0.0]
    prof = Profiler(gpu_sample_hz=0.0, clock=lambda: now[0], thread_clock=lambda: now[0])
    now[0] = 1.0
    with prof.remote_span("policy", "requests_in_flight"):
        now[0] = 2.0
        with prof.span("rollout", "env_step"):  # this thread works for the rollout meanwhile
            now[0] = 3.0
        now[0] = 5.0
    now[0] = 10.0
    report = prof.finish()
    assert report.row("policy").busy_pct == pytest.approx(40.0)  # [1, 5] of [0, 10]
    assert report.row("policy").cpu_pct == 0.0  # its CPU is another process's (`bind_process`)
    assert report.row("rollout").cpu_pct == pytest.approx(10.0)  # the thread's 1 s inside its span

def test_without_the_plot_the_picture_is_drawn_later_from_the_trace(tmp_path):
    pytest.importorskip("matplotlib")
    now = [0.0]
    prof = Profiler(gpu_sample_hz=0.0, clock=lambda: now[0], thread_clock=lambda: now[0])
    for stage, t0 in (("rollout", 0.0), ("learner", 1.0), ("rollout", 2.0)):
        now[0] = t0
        with prof.span(stage, "x"):
            now[0] = t0 + 0.5
    prof.gauge("queue", 2)
    written = prof.write(tmp_path, plot=False)
    assert {p.name for p in written} == {"profile.json", "profile_table.json"} and not (tmp_path / PLOT_FILE).exists()
    assert write_plot_from_trace(tmp_path / "profile.json", tmp_path / PLOT_FILE)
    assert (tmp_path / PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_disabled_profiler_records_nothing_and_writes_nothing(tmp_path):
    prof = Profiler(enabled=False)
    with prof.span("rollout", "env_step"), prof.wait("gate", "recv"), prof.cuda_span("policy"):
        prof.items("rollout", 3)
        prof.gauge("queue", 1)
        prof.latency("policy", "act", 0.1)
    prof.bind_thread("learner")
    report = prof.finish()
    assert report.rows[0].stage == UNATTRIBUTED
    assert len(report.rows) == 1
    assert report.spans == 0
    assert prof.write(tmp_path / "run") == []
    assert not (tmp_path / "run").exists()


async def test_disabled_sampling_is_a_plain_block():
    prof = Profiler(enabled=False)
    async with prof.sampling():
        await trio.lowlevel.checkpoint()
    assert prof._cpu.samples == []


def test_spans_after_finish_are_not_recorded():
    prof = Profiler(gpu_sample_hz=0.0)
    with prof.span("a"):
        pass
    prof.finish()
    with prof.span("a"):
        pass
    assert sum(len(b.spans) for b in prof._rec.buffers()) == 1


def test_per_thread_cap_drops_and_counts():
    prof = Profiler(gpu_sample_hz=0.0, max_spans_per_thread=3)
    for _ in range(5):
        with prof.span("a"):
            pass
    report = prof.finish()
    assert report.spans == 3
    assert report.dropped_spans == 2
    assert "2 dropped" in report.table_markdown()


def test_spans_from_many_threads_are_all_kept():
    prof = Profiler(gpu_sample_hz=0.0)

    def work():
        for _ in range(1000):
            with prof.span("policy", "act"):
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert prof.finish().row("policy").spans == 4000


def test_with_binding_attributes_only_the_block():
    prof = Profiler(gpu_sample_hz=0.0)

    def worker():
        _burn(100_000)  # not bound: not the policy's
        with prof.bind_thread("policy"):
            _burn(100_000)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    row = prof.finish().row("policy")
    assert 0 < row.cpu_pct


def test_gpu_sampler_without_nvml_reports_unavailable():
    class NoNvml(types.ModuleType):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    sampler = GpuSampler(20.0, lambda: 0.0, nvml=NoNvml("pynvml"))
    assert sampler.open() is False
    assert sampler.status.startswith("n/a (no GPU)")
    assert "Not Found" in sampler.status
    assert sampler.tracks == []
    assert GpuSampler(0.0, lambda: 0.0).open() is False


def _fake_nvml(utils):
    """A pynvml stand-in with one device whose utilization follows `utils` (a test double only)."""
    it = iter(utils)
    nvml = types.SimpleNamespace()
    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: 1
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: b"Fake GPU"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=8 * 2**30, used=2**30)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=next(it, 0), memory=0)
    return nvml


async def test_gpu_samples_are_attributed_to_the_busy_gpu_stage():
    prof = Profiler(gpu_sample_hz=100.0, nvml=_fake_nvml([100] * 1000), gpu_stages=["policy"])
    async with prof.sampling():
        with prof.span("policy", "generate"):
            await trio.sleep(0.1)
        with prof.span("env", "step"):  # not a GPU stage
            await trio.sleep(0.05)
    report = prof.finish()
    assert report.gpu_available
    assert report.gpu_status == "1 device(s): Fake GPU"
    policy, env, rest = report.row("policy"), report.row("env"), report.row(UNATTRIBUTED)
    assert env.gpu_pct is None
    # The device reads 100% throughout: the policy's share is its busy fraction of the sampled time,
    # everything else is unattributed; nothing is lost.
    assert policy.gpu_pct == pytest.approx(policy.busy_pct, abs=12)
    assert policy.gpu_pct + rest.gpu_pct == pytest.approx(report.gpu_mean_util_pct[0], rel=0.2)
    assert "| policy |" in report.table_markdown()
    assert policy.gpu_from == "nvml share" and env.gpu_from == ""  # no CUDA spans: the NVML rule, said so
    assert f"| {policy.gpu_pct:.1f}% (NVML) |" in report.table_markdown()


def test_cuda_span_without_cuda_is_a_plain_span(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch was never imported
    prof = Profiler(gpu_sample_hz=0.0)
    with prof.cuda_span("learner", "backward"):
        pass
    row = prof.finish().row("learner")
    assert row.spans == 1
    assert row.cuda_ms is None
    assert prof._gpu_stages == {"learner"}


def test_cpu_clocks_advance():
    before = process_cpu_seconds()
    mine = thread_cpu_seconds(threading.get_native_id())
    _burn(400_000)
    assert process_cpu_seconds() > before
    if mine is not None:  # Linux /proc
        assert thread_cpu_seconds(threading.get_native_id()) >= mine
    assert thread_cpu_seconds(-1) is None


def test_overhead_estimate_reports_positive_costs():
    prof = Profiler(gpu_sample_hz=0.0)
    with prof.span("a"):
        pass
    est = prof.overhead_estimate(calls=2000)
    assert est["span_us"] > est["null_span_us"] > 0
    assert est["spans"] == 1


def test_bind_process_attributes_another_processes_cpu_to_a_stage() -> None:
    import subprocess

    burn = "import sys; sum(range(5_000_000)); print('done', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        prof = Profiler(gpu_sample_hz=0.1)
        prof.bind_process("engine", child.pid)  # bound right after start: the burn comes after
        with prof.span("engine", "requests_in_flight"):  # (a stage gets its row from its spans)
            assert child.stdout is not None and child.stdout.readline() == b"done\n"
        report = prof.finish()
    finally:
        child.communicate(b"")
    assert report.row("engine").cpu_pct > 0
    assert report.process_cpu_pct is not None and report.process_cpu_pct >= report.row("engine").cpu_pct


async def test_a_bound_process_that_exits_before_finish_keeps_the_cpu_it_used() -> None:
    child = await trio.lowlevel.open_process([sys.executable, "-c", "sum(range(5_000_000))"])
    prof = Profiler(gpu_sample_hz=0.0, cpu_sample_hz=100.0)
    prof.bind_process("engine", child.pid)
    async with prof.sampling():  # the sampler reads it while it runs (a worker stopped with its phase)
        with prof.remote_span("engine", "requests_in_flight"):  # (this thread's CPU is not the engine's)
            await child.wait()
    report = prof.finish()  # the child is gone: only the sampler's readings can say what it used
    assert report.row("engine").cpu_pct > 0
