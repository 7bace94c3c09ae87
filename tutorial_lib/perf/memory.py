"""Peak memory: allocator statistics on CUDA, peak resident set size on the CPU, and the peak of
the tensors a piece of code allocates, on any device (``tensor_peak_bytes``)."""

from __future__ import annotations

import resource
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = [
    "peak_memory_bytes",
    "reset_peak_memory",
    "MemoryReport",
    "memory_report",
    "tensor_peak_bytes",
    "TensorMemoryTracker",
]


def reset_peak_memory(device: torch.device | str) -> None:
    """Reset CUDA's peak counters (the CPU's peak RSS cannot be reset within a process)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device | str) -> int:
    """Peak bytes allocated by tensors on CUDA; on the CPU, the process's peak RSS."""
    report = memory_report(device)
    return report.peak_rss if report.peak_allocated is None else report.peak_allocated


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 2**20:.1f} MiB"


@dataclass
class MemoryReport:
    """Peak memory since the last ``reset_peak_memory`` (CUDA) or since the process began (RSS).

    device: the device the report is for, e.g. ``"cuda:0"`` or ``"cpu"``.
    peak_allocated: CUDA bytes held by tensors at the peak; None on the CPU (no allocator stats).
    peak_reserved: CUDA bytes the caching allocator reserved at the peak; None on the CPU.
    peak_rss: the whole process's peak resident set size in bytes (host memory), always set.
    """

    device: str
    peak_allocated: int | None
    peak_reserved: int | None
    peak_rss: int

    def __str__(self) -> str:
        return (
            f"{self.device}: peak allocated {_mib(self.peak_allocated)}, peak reserved "
            f"{_mib(self.peak_reserved)}, process peak RSS {_mib(self.peak_rss)}"
        )


def memory_report(device: torch.device | str) -> MemoryReport:
    """Peak tensor memory on ``device`` (CUDA allocator) and the process's peak RSS."""
    device = torch.device(device)
    allocated = reserved = None
    if device.type == "cuda":
        allocated = int(torch.cuda.max_memory_allocated(device))
        reserved = int(torch.cuda.max_memory_reserved(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss = rss if sys.platform == "darwin" else rss * 1024  # Linux reports KiB
    return MemoryReport(str(device), allocated, reserved, int(rss))


def _storage(t: object) -> Any:
    """A tensor's untyped storage; None for what is not a tensor or has none (a wrapper
    subclass, a sparse tensor)."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


class TensorMemoryTracker(TorchDispatchMode):
    """Counts the bytes of every tensor storage an op allocates while the mode is active, and
    frees them when the storage dies (a ``weakref.finalize`` on it: a storage that autograd keeps
    for the backward stays counted until the backward frees it). ``peak``: the most bytes live at
    once, above what existed when tracking began; ``live``: what is live now.

    It sees what ops return (outputs, and so what autograd saves), on any device and in the
    backward too; not a kernel's internal scratch buffers, nor the allocator's caching and
    fragmentation (``torch.cuda.max_memory_allocated`` sees those on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def _freed(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        inputs = {_storage(t).data_ptr() for t in tree_flatten((args, kwargs))[0] if _storage(t)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            storage = _storage(t)
            if storage is None:
                continue
            key = storage.data_ptr()
            if key in inputs or key in self._sizes or storage.nbytes() == 0:
                continue  # a view or an in-place result, or already counted
            self._sizes[key] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key)
        return out


def tensor_peak_bytes(fn: Callable[[], object]) -> int:
    """The most bytes of tensors ``fn()`` had allocated at once (``TensorMemoryTracker``),
    measured the same way on a CPU and a GPU; what ``fn`` returns is dropped before it ends."""
    with TensorMemoryTracker() as tracker:
        fn()
    return tracker.peak
