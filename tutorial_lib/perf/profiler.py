"""The top operators by self time, as a small table a notebook can show."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from ..hardware import default_device

__all__ = ["OpStat", "profile_top_ops", "format_op_table"]


@dataclass(frozen=True)
class OpStat:
    name: str
    calls: int
    self_time_s: float  # summed over calls, on the device the op ran on
    share: float  # of the total self time of all ops


def profile_top_ops(
    fn: Callable[[], object], top: int = 10, warmup: int = 1, device: str | None = None
) -> list[OpStat]:
    """Run ``fn`` once under ``torch.profiler`` (after ``warmup`` runs); top ops by self time.

    On CUDA the kernels' device time is used; on the CPU, the host time.
    """
    use_cuda = default_device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
    with profile(activities=activities) as prof:
        fn()
        if use_cuda:
            torch.cuda.synchronize()
    stats = []
    for evt in prof.key_averages():
        if getattr(evt, "is_user_annotation", False):
            continue  # a range the code marked (the trainer's phases), not an operator
        t_us = evt.self_device_time_total if use_cuda else evt.self_cpu_time_total
        if t_us > 0:
            stats.append((evt.key, evt.count, t_us / 1e6))
    total = sum(s[2] for s in stats) or 1.0
    stats.sort(key=lambda s: s[2], reverse=True)
    return [OpStat(name, calls, t, t / total) for name, calls, t in stats[:top]]


def format_op_table(stats: list[OpStat]) -> str:
    """A fixed-width text table: op, calls, self time (ms), share of the total."""
    width = max([len(s.name) for s in stats] + [2])
    lines = [f"{'op':<{width}}  {'calls':>6}  {'self ms':>9}  {'share':>6}"]
    lines += [
        f"{s.name:<{width}}  {s.calls:>6}  {s.self_time_s * 1e3:>9.2f}  {100 * s.share:>5.1f}%"
        for s in stats
    ]
    return "\n".join(lines)
