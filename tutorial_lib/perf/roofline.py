"""The roofline model: is an op limited by arithmetic or by memory traffic?

An op that does F FLOPs and must move Q bytes between HBM (or DRAM) and the chip takes at least
``max(F / peak, Q / bandwidth)``. Its *arithmetic intensity* F / Q decides which term wins: below
the roof's *ridge point* peak / bandwidth it is memory-bound, above it compute-bound.

Byte counts here are the *minimum* traffic (each input read once, each output written once), so
a roofline time is a lower bound. Roofs come from a datasheet (``roof_from_spec``) or are
measured on this machine (``measure_cpu_roof``); every ``Roof`` carries its ``source``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..config import GPTConfig
from ..flops import matmul_flops
from ..hardware import DeviceSpec, describe_device
from .timing import benchmark

if TYPE_CHECKING:  # matplotlib is imported when plotting, not when tutorial_lib.perf is
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "Op",
    "gemm",
    "elementwise",
    "Roof",
    "roof_from_spec",
    "measure_cpu_roof",
    "model_ops",
    "plot_roofline",
]


@dataclass(frozen=True)
class Op:
    """One operation: FLOPs it performs and the minimum bytes it must move to and from memory."""

    name: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP/byte."""
        return self.flops / self.bytes


def gemm(m: int, n: int, k: int, dtype_bytes: int = 2, name: str | None = None) -> Op:
    """(m, k) @ (k, n): 2mnk FLOPs (``flops.matmul_flops``); reads A and B and writes C once:
    (mk + kn + mn) elements."""
    return Op(
        name or f"GEMM {m}x{n}x{k}",
        flops=float(matmul_flops(m, n, k)),
        bytes=float((m * k + k * n + m * n) * dtype_bytes),
    )


def elementwise(
    numel: int,
    reads: int = 1,
    writes: int = 1,
    flops_per_element: float = 1,
    dtype_bytes: int = 2,
    name: str | None = None,
) -> Op:
    """``numel`` outputs, each reading ``reads`` and writing ``writes`` elements of the dtype."""
    return Op(
        name or f"elementwise {numel}",
        flops=float(numel * flops_per_element),
        bytes=float(numel * (reads + writes) * dtype_bytes),
    )


@dataclass(frozen=True)
class Roof:
    """A machine as the roofline sees it: peak FLOP/s, memory bandwidth (bytes/s), and where
    both numbers come from (a datasheet, or a measurement with its date)."""

    name: str
    peak_flops: float
    bandwidth: float
    source: str

    @property
    def ridge(self) -> float:
        """Intensity (FLOP/byte) above which an op is compute-bound."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The roof at ``intensity``: min(peak, bandwidth x intensity) FLOP/s."""
        return min(self.peak_flops, self.bandwidth * intensity)

    def time(self, op: Op) -> float:
        """Lower bound on the op's time in seconds: the larger of compute and memory time."""
        return max(op.flops / self.peak_flops, op.bytes / self.bandwidth)

    def bound(self, op: Op) -> str:
        """``"compute"`` if arithmetic takes longer than memory traffic, else ``"memory"``."""
        return "compute" if op.flops / self.peak_flops > op.bytes / self.bandwidth else "memory"


def roof_from_spec(spec: DeviceSpec, dtype: str) -> Roof:
    """The datasheet roof of ``spec`` for math in ``dtype`` (``"bf16"``, ``"fp8"``, ...)."""
    peak = spec.peak(dtype)
    if peak is None:
        raise ValueError(
            f"{spec.name} has no datasheet peak for dtype {dtype!r}; "
            f"available: {', '.join(spec.peak_flops)}."
        )
    return Roof(f"{spec.name} {dtype}", peak, spec.hbm_bandwidth, spec.source)


def measure_cpu_roof(n: int = 1024, copy_bytes: int = 256 * 2**20, iters: int = 5) -> Roof:
    """Measure this CPU's roof: FP32 ``torch.mm`` of n x n, and a ``copy_bytes`` tensor copy.

    Bandwidth counts read + write (2 x ``copy_bytes`` per copy). Each uses the *fastest* of
    ``iters`` runs: a roof is an upper bound, and other processes only ever slow a run down.
    """
    a, b = torch.randn(n, n), torch.randn(n, n)
    gemm_s = benchmark(lambda: torch.mm(a, b), warmup=1, iters=iters, device="cpu").min
    src = torch.ones(copy_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy_s = benchmark(lambda: dst.copy_(src), warmup=1, iters=iters, device="cpu").min
    name = describe_device("cpu").name
    return Roof(
        name=f"{name} fp32 (measured)",
        peak_flops=matmul_flops(n, n, n) / gemm_s,
        bandwidth=2.0 * src.numel() * 4 / copy_s,
        source=f"measured on {name}, {dt.datetime.now(dt.timezone.utc).date().isoformat()}",
    )


def _bmm(batch: int, m: int, n: int, k: int, dtype_bytes: int, name: str) -> Op:
    op = gemm(m, n, k, dtype_bytes)
    return Op(name, batch * op.flops, batch * op.bytes)


def model_ops(cfg: GPTConfig, batch: int, dtype_bytes: int = 2) -> list[Op]:
    """The main ops of one forward layer of ``GPT`` at T = block_size, plus the LM head.

    GEMMs (M = batch x T tokens, weights read once): QKV (M, 3C, C), attention out-projection
    (M, C, C), MLP fc (M, 4C, C), MLP proj (M, C, 4C), LM head (M, V, C; once per model).
    Assumption: attention is *not* fused, as in SDPA's math backend: the (B, nh, T, T) scores
    go through HBM, so Q K^T, softmax and P V appear as separate ops. A flash kernel keeps the
    scores on chip: those three become one op with far higher intensity.
    Elementwise ops, unfused, every activation in ``dtype_bytes``; FLOPs per element are
    approximate (LayerNorm 8, GELU-tanh 10 with tanh as 1, softmax 5, add 1). LayerNorm and the
    residual add occur twice per layer: those ops cover both. Biases are ignored. The matmuls
    (all layers, LM head) sum to B T ``flops.forward_flops_per_token`` (``tests/test_flops.py``).
    """
    B, T, C, V = batch, cfg.block_size, cfg.n_embd, cfg.vocab_size
    M, nh, hs, db = B * T, cfg.n_head, cfg.head_dim, dtype_bytes
    return [
        gemm(M, 3 * C, C, db, name="QKV projection"),
        _bmm(B * nh, T, T, hs, db, name="attention scores Q K^T"),
        elementwise(B * nh * T * T, flops_per_element=5, dtype_bytes=db, name="softmax"),
        _bmm(B * nh, T, hs, T, db, name="attention P V"),
        gemm(M, C, C, db, name="attention out-projection"),
        gemm(M, 4 * C, C, db, name="MLP fc"),
        elementwise(M * 4 * C, flops_per_element=10, dtype_bytes=db, name="GELU"),
        gemm(M, C, 4 * C, db, name="MLP proj"),
        elementwise(2 * M * C, flops_per_element=8, dtype_bytes=db, name="LayerNorm (x2)"),
        elementwise(2 * M * C, reads=2, dtype_bytes=db, name="residual add (x2)"),
        gemm(M, V, C, db, name="LM head"),
    ]


def _rate(value: float, unit: str) -> str:
    """``3.35e12, "B/s"`` -> ``"3.35 TB/s"``."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def plot_roofline(
    roofs: Sequence[Roof],
    ops: Sequence[Op],
    ax: Axes | None = None,
    title: str = "Roofline: attainable FLOP/s against arithmetic intensity",
) -> Figure:
    """Log-log roofline: one line per roof; each op at its intensity on the *first* roof.

    The roofs' sources are stamped under the axes (``viz.label_hardware``).
    """
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from ..viz import label_hardware

    if not roofs:
        raise ValueError("plot_roofline needs at least one Roof.")
    if ax is None:
        _, ax = plt.subplots()
    lo = min([op.intensity for op in ops] + [r.ridge for r in roofs]) / 4
    hi = max([op.intensity for op in ops] + [r.ridge for r in roofs]) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for i, roof in enumerate(roofs):
        label = (
            f"{roof.name}: {_rate(roof.peak_flops, 'FLOP/s')}, {_rate(roof.bandwidth, 'B/s')}, "
            f"ridge {roof.ridge:.3g} FLOP/B"
        )
        ax.plot(xs, [roof.attainable(x) for x in xs], color=f"C{i}", label=label)
    first = roofs[0]
    for i, op in enumerate(ops):
        y = first.attainable(op.intensity)
        ax.plot([op.intensity], [y], "o", color="0.2", ms=5)
        offset = (5, -11) if i % 2 else (5, 4)  # alternate sides: neighbours often crowd
        ax.annotate(
            op.name, (op.intensity, y), textcoords="offset points", xytext=offset, fontsize=7
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.legend(fontsize=8, loc="lower right")
    label_hardware(ax, "; ".join(dict.fromkeys(r.source for r in roofs)))
    fig = ax.figure
    return fig if isinstance(fig, Figure) else fig.figure  # a subfigure's root figure
