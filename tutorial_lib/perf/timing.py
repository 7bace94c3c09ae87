"""Timing GPU and CPU code honestly.

CUDA kernels are launched asynchronously: ``time.perf_counter()`` around a CUDA call measures the
launch, not the work. On CUDA we record events on the stream and synchronise before reading
them; on the CPU we time with ``perf_counter``. Both warm up first (allocator, autotuning, lazy
init) and report the median of many runs, which is robust to the occasional slow outlier.

A kernel timed on the *same* inputs over and over finds them in cache from the second call on;
a real training step does not. ``make_rotating_inputs`` builds enough copies of the inputs to
exceed the last-level cache (``l2_cache_bytes``), and ``benchmark(..., inputs=...)`` cycles
through them. ``naive_time`` and ``synced_time`` exist for the "naive timers lie" demo.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checks import check_positive_int
from ..hardware import default_device

__all__ = [
    "BenchResult",
    "benchmark",
    "synchronize",
    "l2_cache_bytes",
    "make_rotating_inputs",
    "naive_time",
    "synced_time",
]


@dataclass(frozen=True)
class BenchResult:
    """Per-call times in seconds over ``iters`` timed calls (the warm-up calls not included)."""

    times: tuple[float, ...]

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


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on ``device`` (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call_plan(
    fn: Callable[..., object], inputs: Sequence[tuple] | None, warmup: int, iters: int
) -> tuple[list[Callable[[], object]], list[Callable[[], object]]]:
    """Zero-argument calls for the warm-up and the timed runs.

    With ``inputs``, timed call ``i`` uses ``inputs[i % n]`` and warm-up call ``j`` uses
    ``inputs[(j - warmup) % n]``: one unbroken rotation, so no input is used twice in a row
    (for n > 1), not even across the warm-up/timed boundary.
    """
    if inputs is None:
        return [fn] * warmup, [fn] * iters
    if len(inputs) == 0:
        raise ValueError("inputs is empty; pass at least one argument tuple (or None).")
    n = len(inputs)

    def bind(args: tuple) -> Callable[[], object]:
        return lambda: fn(*args)

    return (
        [bind(inputs[(j - warmup) % n]) for j in range(warmup)],
        [bind(inputs[i % n]) for i in range(iters)],
    )


def benchmark(
    fn: Callable[..., object],
    warmup: int = 3,
    iters: int = 10,
    device: torch.device | str | None = None,
    inputs: Sequence[tuple] | None = None,
) -> BenchResult:
    """Time ``fn()``: ``warmup`` untimed calls, then ``iters`` timed calls, one time per call.

    ``device`` defaults to CUDA when available. On CUDA each call is bracketed by events and
    all events are read after one final synchronisation, so timing adds no host stalls between
    calls but still measures the GPU work.

    ``inputs``: argument tuples to rotate through (see ``make_rotating_inputs``); timed call
    ``i`` runs ``fn(*inputs[i % len(inputs)])``, and the warm-up calls rotate too.
    """
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}.")
    device = default_device(device)
    warm_calls, timed_calls = _call_plan(fn, inputs, warmup, iters)
    for call in warm_calls:
        call()
    synchronize(device)
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        with torch.cuda.device(device):  # events on `device`'s current stream
            for s, e, call in zip(starts, ends, timed_calls, strict=True):
                s.record()
                call()
                e.record()
        synchronize(device)
        times = tuple(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True))
    else:
        times_list = []
        for call in timed_calls:
            t0 = time.perf_counter()
            call()
            synchronize(device)
            times_list.append(time.perf_counter() - t0)
        times = tuple(times_list)
    return BenchResult(times)


# ---- caches and rotating inputs ------------------------------------------------------------

_CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def _parse_cache_size(text: str) -> int:
    """Bytes in a sysfs cache size such as ``"32K"``, ``"1024K"`` or ``"32M"``."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"Cannot parse cache size {text!r}; expected e.g. '32K' or '32M'.")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]


def _cpu_cache_bytes(cache_dir: Path = _CPU_CACHE_DIR) -> int | None:
    """The largest cache of CPU 0 (the last level), from sysfs; None if unreadable."""
    sizes = []
    for index in sorted(cache_dir.glob("index*")):
        try:
            sizes.append(_parse_cache_size((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    return max(sizes) if sizes else None


def l2_cache_bytes(device: torch.device | str | None = None) -> int | None:
    """Bytes of the cache that a benchmark's inputs must exceed to come from memory.

    CUDA: the GPU's L2 (``L2_cache_size``; 50 MiB on an H100 SXM). CPU: the largest cache
    level in sysfs (usually the shared L3, despite the name); None if it cannot be read.
    """
    device = default_device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return int(torch.cuda.get_device_properties(index).L2_cache_size)
    return _cpu_cache_bytes()


def make_rotating_inputs(
    make: Callable[[], tuple], min_total_bytes: int, max_copies: int = 64
) -> list[tuple]:
    """Call ``make()`` until the tensors of all returned tuples exceed ``min_total_bytes``.

    Pass e.g. ``2 * l2_cache_bytes()`` so that each timed call of ``benchmark(..., inputs=...)``
    reads inputs that were evicted since their last use. Returns at least one copy and at most
    ``max_copies`` (which bounds memory when the cache is large or ``make`` returns few bytes).
    """
    check_positive_int(max_copies, "max_copies")
    copies: list[tuple] = []
    total = 0
    while len(copies) < max_copies and (not copies or total <= min_total_bytes):
        args = tuple(make())
        copies.append(args)
        total += sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    return copies


# ---- the "naive timers lie" demo -----------------------------------------------------------


def naive_time(fn: Callable[[], object]) -> float:
    """Seconds for one ``fn()`` by ``perf_counter`` alone. On CUDA this times the *launch*."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def synced_time(fn: Callable[[], object], device: torch.device | str) -> float:
    """Seconds for one ``fn()``, synchronising before (so earlier queued work is not charged)
    and after (so this call's own work is). Still one sample: use ``benchmark`` for real numbers.
    """
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0
