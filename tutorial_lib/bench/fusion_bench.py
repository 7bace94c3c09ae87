"""Memory-bound ops three ways (eager, ``torch.compile``, our Triton kernels) and whole training
steps eager vs compiled vs fused: the measurements behind chapter 7 and ``benchmarks/fusion.py``.

Each op row has the median time, the op's minimum HBM traffic (``kernels.traffic``), the achieved
bandwidth against that minimum and, on a GPU in the spec table, the fraction of the datasheet's
HBM bandwidth. Triton kernels are timed on CUDA only: on a CPU they run in Triton's interpreter,
whose time measures Python, not memory, and the row says so instead of showing a number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from matplotlib.axes import Axes
from tqdm.auto import tqdm

from .. import kernels
from ..config import RunPreset
from ..hardware import describe_device
from ..kernels import traffic
from ..perf.timing import benchmark
from .ladder import Rung, run_ladder

__all__ = ["OpCase", "op_cases", "time_ops", "step_rows", "plot_op_bandwidth", "IMPLS"]

IMPLS = ("eager", "compile", "triton")


@dataclasses.dataclass
class OpCase:
    """One op: its inputs, the eager function, our kernel, and its minimum traffic in bytes."""

    name: str
    shape: str
    inputs: tuple[torch.Tensor, ...]
    eager: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]
    triton: Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]
    min_bytes: int


def _add_ln(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + r
    return s, F.layer_norm(s, s.shape[-1:], w, b, 1e-5)


def op_cases(
    preset: RunPreset, dtype: torch.dtype, device: torch.device, batch: int | None = None
) -> list[OpCase]:
    """The five memory-bound ops at the preset model's shapes, for ``batch`` sequences (default
    the preset's ``bench_batch_size``)."""
    cfg = preset.model_config()
    B, T, C, V = batch or preset.bench_batch_size, cfg.block_size, cfg.n_embd, cfg.vocab_size
    M = B * T
    g = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(dt)

    w, b = rand(C, dt=torch.float32), rand(C, dt=torch.float32)
    targets = torch.randint(V, (M,), generator=g, device=device)
    rows = B * cfg.n_head * T
    return [
        OpCase(
            "bias + GELU",
            f"({M}, {4 * C})",
            (rand(M, 4 * C), rand(4 * C)),
            lambda x, bb: F.gelu(x + bb, approximate="tanh"),
            kernels.bias_gelu,
            traffic.bias_gelu_bytes(M, 4 * C, dtype),
        ),
        OpCase(
            "LayerNorm",
            f"({M}, {C})",
            (rand(M, C), w, b),
            lambda x, ww, bb: F.layer_norm(x, (C,), ww, bb, 1e-5),
            kernels.layer_norm,
            traffic.layer_norm_bytes(M, C, dtype),
        ),
        OpCase(
            "residual add + LayerNorm",
            f"({M}, {C})",
            (rand(M, C), rand(M, C), w, b),
            _add_ln,
            kernels.add_layer_norm,
            traffic.add_layer_norm_bytes(M, C, dtype),
        ),
        OpCase(
            "softmax",
            f"({rows}, {T})",
            (rand(rows, T),),
            lambda x: torch.softmax(x, dim=-1),
            kernels.softmax,
            traffic.softmax_bytes(rows, T, dtype),
        ),
        OpCase(
            "cross-entropy",
            f"({M}, {V})",
            (rand(M, V), targets),
            lambda x, t: F.cross_entropy(x.float(), t),
            kernels.cross_entropy,
            traffic.cross_entropy_bytes(M, V, dtype),
        ),
    ]


def time_ops(
    cases: Sequence[OpCase], device: torch.device, timing: tuple[int, int], progress: bool = True
) -> list[dict[str, Any]]:
    """One row per (op, implementation): time, traffic, GB/s, fraction of the HBM peak."""
    spec = describe_device(device).spec
    rows = []
    for case in tqdm(cases, desc="ops", unit="op", disable=not progress, dynamic_ncols=True):
        impls: dict[str, Callable[..., Any] | str] = {
            "eager": case.eager,
            "compile": torch.compile(case.eager, dynamic=False),
            "triton": case.triton
            if device.type == "cuda"
            else (
                "Triton kernels are timed on a CUDA GPU only: on a CPU they run in the "
                "interpreter, whose time measures Python, not memory"
            ),
        }
        for impl, fn in impls.items():
            row: dict[str, Any] = {
                "op": case.name,
                "impl": impl,
                "shape": case.shape,
                "dtype": str(case.inputs[0].dtype).removeprefix("torch."),
            }
            if isinstance(fn, str):
                rows.append({**row, "skipped": fn})
                continue
            with torch.no_grad():
                result = benchmark(lambda f=fn, a=case.inputs: f(*a), *timing, device=device)
            achieved = case.min_bytes / result.median  # bytes/s against the minimum traffic
            rows.append(
                {
                    **row,
                    "time_us": 1e6 * result.median,
                    "min_bytes": case.min_bytes,
                    "GB/s": achieved / 1e9,
                    "fraction_of_hbm_peak": achieved / spec.hbm_bandwidth if spec else None,
                }
            )
    return rows


def step_rows(preset: RunPreset, device: torch.device, steps: int) -> list[dict[str, Any]]:
    """Whole training steps: eager, compiled and (GPU) our Triton kernels, same precision."""
    precision = "bf16" if device.type == "cuda" else "fp32"  # CPU BF16 speed varies by CPU
    rungs = [Rung("eager", precision), Rung("compile", precision, compile=True)]
    if device.type == "cuda":
        rungs.append(Rung("triton kernels", precision, fused=True))
    rows = run_ladder(  # count_breaks=False: reuse what chapter 7 compiled in section 7.4
        preset,
        device,
        rungs,
        steps=steps,
        batch=preset.bench_batch_size,
        progress=False,
        count_breaks=False,
    )
    keep = (
        "rung",
        "precision",
        "skipped",
        "step_time_ms",
        "tokens_per_s",
        "mfu",
        "peak_mem_bytes",
        "compile_s",
        "final_loss",
    )
    return [{k: r[k] for k in keep if k in r} for r in rows]


def plot_op_bandwidth(ax: Axes, rows: Sequence[dict[str, Any]], title: str) -> Axes:
    """Grouped bars of effective bandwidth (minimum bytes / median time) per op and
    implementation, from ``time_ops`` rows; a row that was not timed is marked "GPU only"."""
    names = list(dict.fromkeys(r["op"] for r in rows))
    width = 0.8 / len(IMPLS)
    for j, impl in enumerate(IMPLS):
        found = {r["op"]: r.get("GB/s") for r in rows if r["impl"] == impl}
        xs = [i + (j - 1) * width for i in range(len(names))]
        ax.bar(xs, [found.get(n) or 0.0 for n in names], width, label=impl, color=f"C{j}")
        for x, n in zip(xs, names, strict=True):
            if found.get(n) is None:
                ax.annotate("GPU\nonly", (x, 0), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(names)), [n.replace(" + ", " +\n") for n in names], fontsize=8)
    ax.set(title=title, ylabel="effective bandwidth (GB/s)")
    return ax
