"""Peak memory: allocator statistics on CUDA, peak resident set size on the CPU."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import torch

__all__ = ["peak_memory_bytes", "reset_peak_memory", "MemoryReport", "memory_report"]


def reset_peak_memory(device: torch.device | str) -> None:
    """Reset CUDA's peak counters (the CPU's peak RSS cannot be reset within a process)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def peak_memory_bytes(device: torch.device | str) -> int:
    """Peak bytes allocated by tensors on CUDA; on the CPU, the process's peak RSS."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return _peak_rss_bytes()


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
    return MemoryReport(str(device), allocated, reserved, _peak_rss_bytes())
