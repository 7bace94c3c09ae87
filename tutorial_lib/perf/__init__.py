"""Measuring honestly: timing, throughput and MFU, memory, and profiler summaries."""

from .memory import peak_memory_bytes, reset_peak_memory
from .mfu import format_mfu, mfu, tokens_per_second
from .profiler import OpStat, format_op_table, profile_top_ops
from .timing import BenchResult, benchmark, synchronize

__all__ = [
    "BenchResult",
    "benchmark",
    "synchronize",
    "tokens_per_second",
    "mfu",
    "format_mfu",
    "peak_memory_bytes",
    "reset_peak_memory",
    "OpStat",
    "profile_top_ops",
    "format_op_table",
]
