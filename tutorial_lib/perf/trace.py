"""Trace-level profiling: record a training step's timeline, save it for Perfetto, and read it back.

``record_trace(fn, path)`` runs ``fn`` under ``torch.profiler`` (host ops, and the GPU's kernels
on CUDA) and writes a Chrome-trace JSON file, which https://ui.perfetto.dev and
``chrome://tracing`` open. The trainer marks its phases (``phase``): ``forward``, ``backward``
and ``optimizer`` appear as ranges in the trace and, on a GPU, as NVTX ranges for Nsight Systems.

``load_trace(path)`` reads the file back as ``TraceEvent``s, and ``trace_summary`` computes what a
reader looks for in a timeline:

- ``window_us``: from the first phase's start to the last one's end;
- ``busy_us`` / ``idle_us``: the time the device's work covers inside the window (the union of
  GPU kernels on CUDA; on a CPU, of the top-level operators of the thread that ran the step),
  and the rest: launch overhead, Python, waits;
- per phase, its length and the busy time inside it;
- ``kernels``: how many GPU kernels (on a CPU: top-level operators) ran, the count that tells a
  launch-bound step from a compute-bound one;
- ``comm_us`` and ``comm_overlap``: the time in collectives (gloo's operators on a CPU, NCCL's
  kernels on a GPU) and the fraction of it during which other work ran: on another stream or
  thread, since the operator that issued a collective and waits for it is not other work.

``plot_timeline`` draws the phases and the operators (and kernels) on a time axis, from the file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ..hardware import default_device

__all__ = [
    "PHASES",
    "TraceEvent",
    "load_trace",
    "phase",
    "plot_timeline",
    "record_trace",
    "trace_summary",
]

PHASES = ("forward", "backward", "optimizer")


def _is_collective(name: str) -> bool:
    """A collective: a c10d operator (``c10d::allreduce_``), gloo's own ranges, NCCL kernels;
    not ``aten::broadcast_tensors`` and the like."""
    lower = name.lower()
    return lower.startswith("c10d::") or "gloo" in lower or "nccl" in lower


@contextlib.contextmanager
def phase(name: str, device: torch.device | str | None = None) -> Iterator[None]:
    """Mark a phase of a step: a ``record_function`` range in any profile, and an NVTX range on
    CUDA (what Nsight Systems shows). Costs about a microsecond when nothing records."""
    nvtx = device is not None and torch.device(device).type == "cuda"
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with record_function(name):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()


def record_trace(
    fn: Callable[[], object],
    path: str | Path,
    warmup: int = 1,
    steps: int = 1,
    device: torch.device | str | None = None,
) -> Path:
    """``fn()`` ``warmup`` times, then ``steps`` times under the profiler; the Chrome trace is
    written to ``path`` (its folder is created)."""
    dev = default_device(device)
    for _ in range(warmup):
        fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return path


@dataclass(frozen=True)
class TraceEvent:
    """One complete event ("ph": "X") of a Chrome trace; times in microseconds."""

    name: str
    cat: str
    ts: float
    dur: float
    pid: Any
    tid: Any

    @property
    def end(self) -> float:
        return self.ts + self.dur


def load_trace(path: str | Path) -> list[TraceEvent]:
    """The complete events of a Chrome-trace file, sorted by start time."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable Chrome trace (JSON): {err}") from None
    raw = data.get("traceEvents", []) if isinstance(data, dict) else data
    events = [
        TraceEvent(
            str(e.get("name", "")),
            str(e.get("cat", "")),
            float(e["ts"]),
            float(e["dur"]),
            e.get("pid"),
            e.get("tid"),
        )  # fmt: skip
        for e in raw
        if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e
    ]
    return sorted(events, key=lambda e: (e.ts, -e.dur))


def _union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _clip(
    intervals: Sequence[tuple[float, float]], lo: float, hi: float
) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo)]


def _top_level(ops: Sequence[TraceEvent]) -> list[TraceEvent]:
    """Operators not nested inside another operator of the same thread (the ones a step
    calls; their children are their own work)."""
    out: list[TraceEvent] = []
    open_end: dict[Any, float] = {}
    for e in sorted(ops, key=lambda e: (e.ts, -e.dur)):
        if e.ts >= open_end.get((e.pid, e.tid), float("-inf")):
            out.append(e)
            open_end[(e.pid, e.tid)] = e.end
    return out


def _marks(events: Sequence[TraceEvent], cat: str = "user_annotation") -> list[TraceEvent]:
    """The phase ranges: the host's (``user_annotation``), or the GPU's."""
    return [e for e in events if e.cat == cat and e.name in PHASES]


def device_work(events: Sequence[TraceEvent]) -> tuple[list[TraceEvent], str]:
    """The events that are the device's work: GPU kernels if the trace has any, else the
    top-level operators of the step's thread (the one that ran the phases); and which of the
    two ("kernels", "operators")."""
    kernels = [e for e in events if e.cat == "kernel"]
    if kernels:
        return kernels, "kernels"
    thread = [(e.pid, e.tid) for e in _marks(events)][:1]
    ops = [e for e in events if e.cat == "cpu_op" and (not thread or (e.pid, e.tid) == thread[0])]
    return _top_level(ops), "operators"


def trace_summary(events: Sequence[TraceEvent]) -> dict[str, Any]:
    """What the timeline says (module docstring); times in microseconds. On a GPU the phases
    are the device-side ranges (``gpu_user_annotation``) where the trace has them, and the
    window reaches the last kernel: the host runs ahead of the GPU."""
    if not events:
        raise ValueError("The trace holds no complete events: was anything profiled?")
    work, kind = device_work(events)
    gpu_marks = _marks(events, "gpu_user_annotation")
    marks = gpu_marks if kind == "kernels" and gpu_marks else _marks(events)
    bounds = marks + (work if kind == "kernels" else []) or list(events)
    lo, hi = min(e.ts for e in bounds), max(e.end for e in bounds)
    busy = _union(_clip([(e.ts, e.end) for e in work], lo, hi))
    phases = {}
    for name in PHASES:
        spans = _union([(e.ts, e.end) for e in marks if e.name == name])
        if spans:
            phases[name] = {
                "us": _length(spans),
                "busy_us": sum(_length(_clip(busy, s, t)) for s, t in spans),
            }
    comm_cat = "kernel" if kind == "kernels" else "cpu_op"  # NCCL kernels, or gloo's ops
    comm = [e for e in events if e.cat == comm_cat and _is_collective(e.name)]
    comm_spans = _union(_clip([(e.ts, e.end) for e in comm], lo, hi))
    own: dict[Any, list[tuple[float, float]]] = {}  # per thread (or stream): its collectives
    for e in comm:
        own.setdefault((e.pid, e.tid), []).append((e.ts, e.end))
    comm_ids = {id(e) for e in comm}
    others: list[tuple[float, float]] = []  # other work, less the collectives it waits in
    for e in work:
        if id(e) not in comm_ids:
            others += _subtract((e.ts, e.end), _union(own.get((e.pid, e.tid), [])))
    others = _union(others)
    overlapped = sum(_length(_clip(others, s, t)) for s, t in comm_spans)
    comm_us = _length(comm_spans)
    return {
        "window_us": hi - lo,
        "busy_us": _length(busy),
        "idle_us": (hi - lo) - _length(busy),
        "busy_share": _length(busy) / (hi - lo) if hi > lo else 0.0,
        "work": kind,
        "kernels": sum(1 for e in work if lo <= e.ts <= hi),
        "phases": phases,
        "comm_us": comm_us,
        "comm_overlap": overlapped / comm_us if comm_us else None,
    }


def _subtract(
    span: tuple[float, float], holes: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """``span`` less the (sorted, disjoint) ``holes``."""
    out, start = [], span[0]
    for lo, hi in holes:
        if hi <= start or lo >= span[1]:
            continue
        if lo > start:
            out.append((start, lo))
        start = max(start, hi)
    if start < span[1]:
        out.append((start, span[1]))
    return out


_PHASE_COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}


def plot_timeline(ax: Any, events: Sequence[TraceEvent], top: int = 8) -> None:
    """The step's phases (top row) and the device's work below them, one row per kind: the
    ``top`` longest operator (or kernel) names get their own colour, the rest are grey. Time in
    milliseconds from the first phase."""
    marks = _marks(events)
    work, kind = device_work(events)
    t0 = min(e.ts for e in (marks or work))
    totals: dict[str, float] = {}
    for e in work:
        totals[e.name] = totals.get(e.name, 0.0) + e.dur
    named = sorted(totals, key=lambda n: totals[n], reverse=True)[:top]
    palette = [f"C{i}" for i in range(10)]
    for e in marks:
        ax.broken_barh(
            [((e.ts - t0) / 1e3, e.dur / 1e3)], (1.1, 0.8), color=_PHASE_COLORS[e.name], alpha=0.6
        )
        ax.text((e.ts - t0 + e.dur / 2) / 1e3, 1.5, e.name, ha="center", va="center", fontsize=8)
    for e in work:
        color = palette[named.index(e.name) % 10] if e.name in named else "0.75"
        ax.broken_barh([((e.ts - t0) / 1e3, max(e.dur, 0.5) / 1e3)], (0.1, 0.8), color=color)
    for i, name in enumerate(named):
        label = name.removeprefix("autograd::engine::evaluate_function: ")  # backward ops
        ax.plot([], [], color=palette[i % 10], linewidth=6, label=label)
    ax.set_yticks([0.5, 1.5], [kind, "phases"])
    ax.set_xlabel("time (ms)")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(0, -0.25))
