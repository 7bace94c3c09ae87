"""Measuring honestly: timing, throughput and MFU, memory, FLOP counts, rooflines, profiler
summaries, and the recorded-results format every benchmark writes."""

from .flops import count_flops, flops_by_op, train_step_flops
from .fp8_model import GemmCost, linear_layer_cost, sweep
from .measured import NOISE, GemmRates, compare_times, measure_gemm_rates, on_this_device
from .memory import MemoryReport, memory_report, peak_memory_bytes, reset_peak_memory
from .mfu import format_mfu, mfu, tokens_per_second
from .policy_bench import benchmark_policies, make_step, run_policy
from .profiler import OpStat, format_op_table, profile_top_ops
from .results import (
    environment_stamp,
    latest_hopper_results,
    load_results,
    markdown_table,
    results_label,
    write_and_print,
    write_results,
)
from .roofline import (
    Op,
    Roof,
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

__all__ = [
    # timing
    "BenchResult",
    "benchmark",
    "synchronize",
    "l2_cache_bytes",
    "make_rotating_inputs",
    "naive_time",
    "synced_time",
    # statements from measurements on the machine at hand
    "GemmRates",
    "measure_gemm_rates",
    "compare_times",
    "on_this_device",
    "NOISE",
    # throughput and MFU
    "tokens_per_second",
    "mfu",
    "format_mfu",
    # memory
    "peak_memory_bytes",
    "reset_peak_memory",
    "MemoryReport",
    "memory_report",
    # FLOP counting
    "count_flops",
    "flops_by_op",
    "train_step_flops",
    # roofline
    "Op",
    "gemm",
    "elementwise",
    "Roof",
    "roof_from_spec",
    "measure_cpu_roof",
    "model_ops",
    "plot_roofline",
    # FP8 cost model (chapter 5)
    "GemmCost",
    "linear_layer_cost",
    "sweep",
    # recorded results
    "environment_stamp",
    "write_results",
    "write_and_print",
    "load_results",
    "latest_hopper_results",
    "results_label",
    "markdown_table",
    # precision-policy benchmark (benchmarks/precision.py, chapter 3)
    "benchmark_policies",
    "make_step",
    "run_policy",
    # profiler
    "OpStat",
    "profile_top_ops",
    "format_op_table",
]
