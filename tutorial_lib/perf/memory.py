"""Peak memory: allocator statistics on CUDA, peak resident set size on the CPU."""

from __future__ import annotations

import resource
import sys

import torch

__all__ = ["peak_memory_bytes", "reset_peak_memory"]


def reset_peak_memory(device: torch.device | str) -> None:
    """Reset CUDA's peak counters (the CPU's peak RSS cannot be reset within a process)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device | str) -> int:
    """Peak bytes allocated by tensors on CUDA; on the CPU, the process's peak RSS."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB
