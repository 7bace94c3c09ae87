"""Measuring honestly: timing, throughput and MFU, memory, FLOP counts, rooflines, profiler
summaries, and measured statements about the machine at hand.

This package sits *below* the trainer (``train`` uses its timing, MFU and memory functions) and
imports nothing that trains. The benchmarks that build and train models, and the
recorded-results format they write, are one level up in ``tutorial_lib.bench``."""

from .flop_counter import flops_by_op, train_step_flops
from .measured import NOISE, compare_times, measure_gemm_rates, on_this_device
from .memory import memory_report, peak_memory_bytes, reset_peak_memory, tensor_peak_bytes
from .mfu import format_mfu, mfu
from .profiler import format_op_table, profile_top_ops
from .roofline import (
    Op,
    elementwise,
    gemm,
    measure_cpu_roof,
    model_ops,
    plot_roofline,
    roof_from_spec,
)
from .timing import (
    BenchResult,
    benchmark,
    l2_cache_bytes,
    make_rotating_inputs,
    naive_time,
    synced_time,
    synchronize,
)
from .trace import (
    load_trace,
    phase,
    plot_timeline,
    record_trace,
    trace_summary,
)

__all__ = [
    # traces
    "load_trace",
    "phase",
    "plot_timeline",
    "record_trace",
    "trace_summary",
    # timing
    "BenchResult",
    "benchmark",
    "synchronize",
    "l2_cache_bytes",
    "make_rotating_inputs",
    "naive_time",
    "synced_time",
    # statements from measurements on the machine at hand
    "measure_gemm_rates",
    "compare_times",
    "on_this_device",
    "NOISE",
    # MFU
    "mfu",
    "format_mfu",
    # memory
    "peak_memory_bytes",
    "reset_peak_memory",
    "memory_report",
    "tensor_peak_bytes",
    # FLOP counting
    "flops_by_op",
    "train_step_flops",
    # roofline
    "Op",
    "gemm",
    "elementwise",
    "roof_from_spec",
    "measure_cpu_roof",
    "model_ops",
    "plot_roofline",
    # profiler
    "profile_top_ops",
    "format_op_table",
]
