"""BF16 and FP8 GEMM times by width, on inputs that come from memory (chapter 5, section 5.5).

Chapter 2's rules for timing a kernel apply to a GEMM too. At 1024 x 1024 x 1024 a GEMM does
2.1 GFLOP, about 2 us at Hopper's dense BF16 peak and 1 us at FP8's: no longer than a kernel
launch (a few microseconds), and its 2-4 MiB of operands stay in an H100's 50 MB L2 from one
call to the next. Timing it measures launch overhead and the cache, not FP8 arithmetic. So:

- the **sweep** times square GEMMs at the preset's ``gemm_widths`` (4096 to 8192 at ``hopper``)
  with *rotating* inputs: ``perf.make_rotating_inputs`` makes copies of the operands until all
  of them exceed twice the cache (``perf.l2_cache_bytes``; at least two copies), and
  ``perf.benchmark(..., inputs=...)`` cycles through them, so every call reads operands that were
  evicted since their last use;
- the **small** GEMM (``gemm_small_width``, 1024 at ``hopper``) is timed on one set of inputs,
  as a cautionary example, and its records say so (``role``, ``l2_resident``).

FP8 runs through ``fp8.scaled_gemm`` (E4M3 operands already quantized, unit scales, BF16
output): ``torch._scaled_mm`` on a CUDA GPU with FP8 tensor cores (sm_89+), the FP32 emulation
everywhere else (FP8 widened to FP32, an FP32 matmul). On a CPU, or a GPU without FP8 units,
the FP8 records therefore time the *emulation's cost*, not FP8 speed, and ``path`` says which
ran. ``torch._scaled_mm`` is never called on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure, SubFigure

from ..config import RunPreset
from ..fp8.formats import E4M3, quantize
from ..fp8.gemm import scaled_gemm
from ..hardware import default_device, fp8_gemm_status
from ..perf.timing import benchmark, l2_cache_bytes, make_rotating_inputs
from ..viz import label_hardware

__all__ = [
    "GemmTiming",
    "gemm_sweep",
    "gemm_sweep_table",
    "flops_unit",
    "plot_gemm_sweep",
    "rotation_bytes",
]

SWEEP, SMALL = "rotating inputs", "launch/L2-bound"
FP8_TENSOR_CORES = "torch._scaled_mm on FP8 tensor cores"
FP8_EMULATION = "emulation (FP8 widened to FP32, FP32 matmul): emulation cost, not FP8 speed"
BF16_MATMUL = "bfloat16 matmul"
_MATHS = ("bf16", "fp8")


@dataclass(frozen=True)
class GemmTiming:
    """One timed ``width`` x ``width`` x ``width`` GEMM.

    What ran:
        width: n of the n x n x n GEMM (M = N = K).
        dtype: ``"bf16"`` (``a @ b``) or ``"fp8"`` (``fp8.scaled_gemm``, E4M3, BF16 output).
        path: how it ran here (tensor cores, or the emulation and what its time means).
        role: ``"rotating inputs"`` (the sweep) or ``"launch/L2-bound"`` (the small example).
    Time:
        median_s: median seconds per call over ``iters`` timed calls.
        tflops: ``2 n^3 / median_s / 1e12``.
    Inputs and the cache:
        buffers: distinct operand sets the calls rotate through (1: the same every call).
        bytes_per_set: bytes of one set (both operands).
        cache_bytes: the cache they are measured against: the GPU's L2, or the CPU's last-level
            cache; None when it could not be read.
        l2_resident: True when all sets together fit in that cache, so calls can find their
            operands there; None when the cache size is unknown.
    """

    width: int
    dtype: str
    path: str
    role: str
    median_s: float
    tflops: float
    iters: int
    buffers: int
    bytes_per_set: int
    cache_bytes: int | None
    l2_resident: bool | None


def rotation_bytes(bytes_per_set: int, cache_bytes: int | None) -> int:
    """The ``min_total_bytes`` for ``perf.make_rotating_inputs``: more than twice the cache
    (64 MiB assumed when unknown), and more than one set, so that at least two sets rotate."""
    return max(2 * (cache_bytes or 64 * 2**20), bytes_per_set)


def _operand_maker(
    math: str, n: int, device: torch.device
) -> tuple[Callable[[], tuple[torch.Tensor, ...]], Callable[..., torch.Tensor], str]:
    """``(make, gemm, path)``: ``make()`` returns a fresh copy of the operands (distinct memory,
    same values: one random draw, then copies, which are cheap), ``gemm(*operands)`` runs it."""
    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen, device=device) for _ in range(2))
    if math == "bf16":
        a16, b16 = a.bfloat16(), b.bfloat16()
        return (lambda: (a16.clone(), b16.clone())), torch.matmul, BF16_MATMUL
    emulate = not (device.type == "cuda" and fp8_gemm_status(device)[0])  # FP8 tensor cores?
    path = FP8_EMULATION if emulate else FP8_TENSOR_CORES
    one = torch.ones((), device=device)
    # cuBLASLt's FP8 GEMM wants the second operand column-major; clone() keeps the strides.
    a8, b8 = quantize(a, E4M3, one), quantize(b, E4M3, one).t().contiguous().t()

    def fp8_gemm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return scaled_gemm(x, one, y, one, None, torch.bfloat16, emulate=emulate)

    return (lambda: (a8.clone(), b8.clone())), fp8_gemm, path


def _time_gemm(
    math: str,
    n: int,
    device: torch.device,
    rotate: bool,
    cache: int | None,
    timing: tuple[int, int],
) -> GemmTiming:
    make, gemm, path = _operand_maker(math, n, device)
    per_set = 2 * n * n * (2 if math == "bf16" else 1)
    if rotate:  # enough copies to exceed the cache twice over, whatever max_copies would say
        need = rotation_bytes(per_set, cache)
        inputs = make_rotating_inputs(make, need, max_copies=need // per_set + 1)
    else:
        inputs = [make()]
    result = benchmark(gemm, *timing, device=device, inputs=inputs)
    total = len(inputs) * per_set
    return GemmTiming(
        width=n,
        dtype=math,
        path=path,
        role=SWEEP if rotate else SMALL,
        median_s=result.median,
        tflops=2.0 * n**3 / result.median / 1e12,
        iters=result.iters,
        buffers=len(inputs),
        bytes_per_set=per_set,
        cache_bytes=cache,
        l2_resident=None if cache is None else total <= cache,
    )


def gemm_sweep(
    preset: RunPreset,
    device: torch.device | str | None = None,
    *,
    cache_bytes: int | None = None,
) -> list[GemmTiming]:
    """Time BF16 and FP8 square GEMMs: the small one (``preset.gemm_small_width``) on the same
    inputs, then the sweep (``preset.gemm_widths``) on rotating inputs, ``preset.bench_warmup``
    and ``preset.bench_iters`` calls each. Returns the records, small width first, BF16 before
    FP8 at each width. ``cache_bytes`` defaults to ``perf.l2_cache_bytes(device)``.
    """
    device = default_device(device)
    small, widths = preset.gemm_small_width, list(preset.gemm_widths)
    for n in (small, *widths):
        if isinstance(n, bool) or not isinstance(n, int) or n < 16 or n % 16:
            raise ValueError(
                f"GEMM widths must be multiples of 16 (torch._scaled_mm's rule), got {n!r}"
            )
    cache = l2_cache_bytes(device) if cache_bytes is None else cache_bytes
    timing = (preset.bench_warmup, preset.bench_iters)
    plan = [(small, False)] + [(n, True) for n in widths]
    return [_time_gemm(m, n, device, rot, cache, timing) for n, rot in plan for m in _MATHS]


def flops_unit(records: Sequence[GemmTiming]) -> tuple[str, float]:
    """``("TFLOP/s", 1.0)``, or ``("GFLOP/s", 1e3)`` when every record is below 1 TFLOP/s (a
    CPU): the unit to print the records' ``tflops`` in, and the factor to multiply them by."""
    if max((r.tflops for r in records), default=0.0) >= 1:
        return "TFLOP/s", 1.0
    return "GFLOP/s", 1e3


def gemm_sweep_table(records: Sequence[GemmTiming]) -> str:
    """A plain-text table of the records, one line each, then how each math ran."""
    unit, factor = flops_unit(records)
    where = {True: "L2-resident", False: "from memory", None: "cache size unknown"}
    lines = [
        f"{'width':>6s} {'math':5s} {'median':>11s} {unit:>9s} {'sets':>5s} {'MiB/set':>8s}  inputs"
    ]
    for r in records:
        lines.append(
            f"{r.width:6d} {r.dtype.upper():5s} {r.median_s * 1e6:8.1f} us {r.tflops * factor:9.2f} "
            f"{r.buffers:5d} {r.bytes_per_set / 2**20:8.2f}  {where[r.l2_resident]}: {r.role}"
        )
    paths = {r.dtype: r.path for r in records}
    lines += [f"{math.upper()}: {path}" for math, path in paths.items()]
    return "\n".join(lines)


def plot_gemm_sweep(
    records: Sequence[GemmTiming], ax: Axes | None = None, hardware: str | None = None
) -> Figure | SubFigure:
    """TFLOP/s against width, BF16 and FP8: lines for the rotating sweep, hollow markers for
    the launch/L2-bound small GEMM. Returns the figure ``ax`` is in."""
    if ax is None:
        _, ax = plt.subplots()
    unit, factor = flops_unit(records)
    for i, math in enumerate(_MATHS):
        mine = [r for r in records if r.dtype == math]
        sweep = [r for r in mine if r.role == SWEEP]
        label = "FP8 (emulated)" if mine and mine[0].path == FP8_EMULATION else math.upper()
        ax.plot(
            [r.width for r in sweep],
            [r.tflops * factor for r in sweep],
            "o-",
            color=f"C{i}",
            label=f"{label}, rotating inputs",
        )
        for r in (r for r in mine if r.role == SMALL):
            ax.plot(
                [r.width],
                [r.tflops * factor],
                "o",
                mfc="none",
                color=f"C{i}",
                label=f"{label}, same inputs: {SMALL}",
            )
    ax.set_xscale("log", base=2)
    widths = sorted({r.width for r in records})
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.minorticks_off()
    ax.set(
        title="Square GEMM throughput by width",
        xlabel="width n (an n x n x n GEMM)",
        ylabel=f"{unit} ($2n^3$ / median time)",
    )
    ax.legend(fontsize=8)
    if hardware:
        label_hardware(ax, hardware)
    return ax.figure
