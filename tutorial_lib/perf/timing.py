"""Timing GPU and CPU code honestly.

CUDA kernels are launched asynchronously: ``time.perf_counter()`` around a CUDA call measures the
launch, not the work. On CUDA we record events on the stream and synchronise before reading
them; on the CPU we time with ``perf_counter``. Both warm up first (allocator, autotuning, lazy
init) and report the median of many runs, which is robust to the occasional slow outlier.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["BenchResult", "benchmark", "synchronize"]


@dataclass(frozen=True)
class BenchResult:
    """Per-call times in seconds over ``iters`` timed calls, after ``warmup`` untimed calls."""

    times: tuple[float, ...]
    warmup: int
    device: str

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    @property
    def iters(self) -> int:
        return len(self.times)

    def __str__(self) -> str:
        return (
            f"median {self.median * 1e3:.3f} ms (min {self.min * 1e3:.3f}, "
            f"max {self.max * 1e3:.3f}; {self.iters} runs on {self.device})"
        )


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def benchmark(
    fn: Callable[[], object],
    warmup: int = 3,
    iters: int = 10,
    device: torch.device | str | None = None,
) -> BenchResult:
    """Time ``fn()``: ``warmup`` untimed calls, then ``iters`` timed calls, one time per call.

    ``device`` defaults to CUDA when available. On CUDA each call is bracketed by events and
    all events are read after one final synchronisation, so timing adds no host stalls between
    calls but still measures the GPU work.
    """
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}.")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    for _ in range(warmup):
        fn()
    synchronize(device)
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for s, e in zip(starts, ends, strict=True):
            s.record()
            fn()
            e.record()
        synchronize(device)
        times = tuple(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True))
    else:
        times_list = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times_list.append(time.perf_counter() - t0)
        times = tuple(times_list)
    return BenchResult(times=times, warmup=warmup, device=str(device))
