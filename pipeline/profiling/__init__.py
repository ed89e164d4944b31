"""Per-stage profiling: where the pipeline's wall time, CPU and GPU go, stage by stage.

    prof = Profiler(enabled=True, gpu_sample_hz=20.0)
    async with prof.sampling():                  # CPU + NVML samplers as Trio tasks
        with prof.span("rollout", "env_step"):   # busy; thread-safe; may contain awaits
            ...
    report = prof.finish()
    prof.write(run_dir)                          # profile.json (Perfetto), profile_table.json, profile.png
    print(report.table_markdown())

See docs/profiling.md for what is recorded and the attribution rules.
"""

from ._attribution import RULE_CUDA as RULE_CUDA
from ._attribution import RULE_NVML as RULE_NVML
from ._attribution import UNATTRIBUTED as UNATTRIBUTED
from ._attribution import active_segments as active_segments
from ._attribution import attribute_gpu as attribute_gpu
from ._attribution import attribute_samples as attribute_samples
from ._attribution import attribute_thread_cpu as attribute_thread_cpu
from ._intervals import assign_lanes as assign_lanes
from ._intervals import covered_fraction as covered_fraction
from ._intervals import measure as measure
from ._intervals import union as union
from ._plot import write_plot_from_trace as write_plot_from_trace
from ._profiler import PLOT_FILE as PLOT_FILE
from ._profiler import TRACE_FILE as TRACE_FILE
from ._profiler import Profiler as Profiler
from ._report import TABLE_FILE as TABLE_FILE
from ._report import Report as Report
from ._report import StageRow as StageRow
from ._report import load_report as load_report
from ._trace import validate_trace as validate_trace

__all__ = [
    "PLOT_FILE",
    "RULE_CUDA",
    "RULE_NVML",
    "TABLE_FILE",
    "TRACE_FILE",
    "UNATTRIBUTED",
    "Profiler",
    "Report",
    "StageRow",
    "active_segments",
    "assign_lanes",
    "attribute_gpu",
    "attribute_samples",
    "attribute_thread_cpu",
    "covered_fraction",
    "load_report",
    "measure",
    "union",
    "validate_trace",
    "write_plot_from_trace",
]
