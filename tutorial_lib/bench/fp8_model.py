"""When does FP8 pay off? A roofline cost model of one Linear layer's training GEMMs.

A Linear layer with ``tokens`` rows of input, ``in_features`` K and ``out_features`` N runs three
GEMMs per training step, each 2·m·n·k FLOPs:

    forward  y  = x @ w^T     (M, N, K)   M = tokens
    dgrad    dx = dy @ w      (M, K, N)
    wgrad    dw = dy^T @ x    (N, K, M)

Each GEMM takes ``max(FLOPs / peak, bytes / bandwidth)`` on the roof of its math dtype
(``roof_from_spec(spec, "bf16")`` or ``"fp8"``). Operands are 2 bytes in BF16 and 1 byte in FP8;
outputs are BF16 (2 bytes) in both. FP8 halves the compute time at best (FP8 peak = 2x BF16 on
Hopper) but must first *quantize* its operands, a memory-bound pass that BF16 never pays. For a
small GEMM that pass costs more than the GEMM saves; for a large one it is a few percent, and the
speedup approaches, never reaches, 2x. (Measured small-size slowdowns can have another cause that
this model leaves out: in TE issue #445, FP8 ``te.Linear`` at 1024x1024x1024 was slower than FP16
``te.Linear``, but ``te.Linear`` without FP8 was already about 3x slower than ``torch.nn.Linear``
there, i.e. per-call host overhead dominated, not quantization traffic.)

Quantization bytes counted (per step, unfused, one pass each, all in HBM). This is conservative:
the separate amax pass is what plain-PyTorch ``FP8Linear`` does; TE's cast kernels fold the amax
into the cast:
    for each of x (M·K), w (N·K) and dy (M·N):
        amax reduction   read the BF16 tensor            2 bytes/element
        cast             read the BF16 tensor again      2 bytes/element
                         write the FP8 copy              1 byte/element
    i.e. 5 bytes per element of x, w and dy; no FLOPs are charged (casts are memory-bound).
Not counted: the transposed FP8 copies that Hopper's FP8 GEMMs need for dgrad/wgrad (TE writes
them in the same cast-transpose kernel, +1 byte/element), scale updates (a few scalars) and
kernel launch latency. Transformer Engine fuses the amax into the cast-transpose (4 bytes per
element with the transpose) and the cast of x into the preceding LayerNorm, so these 5 bytes per
element are an *upper bound* on its quantization traffic; TE also casts the weight once per
step, not once per micro-batch, which is what we count too.

Not counted: FP8Linear writes its weight gradient in float32 (4 bytes, not 2); this matters
only for memory-bound shapes and makes the model slightly optimistic for FP8 there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..checks import check_positive_int
from ..hardware import DeviceSpec
from ..perf.roofline import Op, Roof, roof_from_spec

__all__ = ["GemmCost", "QUANT_BYTES_PER_ELEMENT", "linear_layer_cost", "sweep"]

QUANT_BYTES_PER_ELEMENT = 5  # amax read (2) + cast read (2) + FP8 write (1), see module doc


@dataclass(frozen=True)
class GemmCost:
    """Modelled time of one Linear layer's three training GEMMs (forward, dgrad, wgrad).

    m, n, k: the forward GEMM's shape (tokens, out_features, in_features).
    bf16_s: the three GEMMs in BF16.
    fp8_gemm_s: the three GEMMs in FP8 (operands 1 byte, outputs BF16).
    fp8_quant_s: quantizing x, w and dy to FP8 (memory-bound; module doc lists the bytes).
    fp8_total_s: fp8_gemm_s + fp8_quant_s.
    """

    m: int
    n: int
    k: int
    bf16_s: float
    fp8_gemm_s: float
    fp8_quant_s: float
    fp8_total_s: float

    @property
    def speedup(self) -> float:
        """BF16 time over FP8 time, quantization included (> 1: FP8 pays off)."""
        return self.bf16_s / self.fp8_total_s


def training_gemms(m: int, n: int, k: int, operand_bytes: int) -> list[Op]:
    """Forward, dgrad and wgrad of a (m, k) x (k, n) Linear; BF16 outputs (2 bytes)."""
    ops = []
    for name, (a, b, c) in {"forward": (m, n, k), "dgrad": (m, k, n), "wgrad": (n, k, m)}.items():
        ops.append(Op(name, 2.0 * a * b * c, float((a * c + c * b) * operand_bytes + a * b * 2)))
    return ops


def _scaled_roof(spec: DeviceSpec, dtype: str, efficiency: float, bw_efficiency: float) -> Roof:
    roof = roof_from_spec(spec, dtype)
    return Roof(
        name=f"{roof.name} x{efficiency:g} peak, x{bw_efficiency:g} bandwidth",
        peak_flops=roof.peak_flops * efficiency,
        bandwidth=roof.bandwidth * bw_efficiency,
        source=roof.source,
    )


def linear_layer_cost(
    tokens: int,
    in_features: int,
    out_features: int,
    spec: DeviceSpec,
    efficiency: float = 1.0,
    bandwidth_efficiency: float = 1.0,
) -> GemmCost:
    """Roofline time of one Linear layer's training GEMMs in BF16 and in FP8 on ``spec``.

    Shapes: ``tokens`` (M) x ``in_features`` (K) input, ``out_features`` (N) output.
    Efficiency (fractions in (0, 1]):
        efficiency: scales *both FLOP peaks* (BF16 and FP8), e.g. 0.8 for the ~790 of 989
            TFLOP/s a BF16 GEMM reaches on an H200. Below 1 the GEMMs slow down but the
            memory-bound casts do not, so quantization weighs less and the speedup *rises*
            (H100, tokens 16384, h 1024: 1.23x at 1.0, 1.39x at 0.7).
        bandwidth_efficiency: scales the HBM bandwidth (e.g. 0.9 for 4.3 of 4.8 TB/s). Scaling
            both by the same factor scales every time by it and leaves ``speedup`` unchanged.
    Raises ValueError for a non-positive size, an efficiency outside (0, 1], or a spec without
    an FP8 peak (e.g. A100).
    """
    for name, size in (
        ("tokens", tokens),
        ("in_features", in_features),
        ("out_features", out_features),
    ):
        check_positive_int(size, name)
    for name, value in (("efficiency", efficiency), ("bandwidth_efficiency", bandwidth_efficiency)):
        if not 0 < value <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {value}.")
    m, n, k = tokens, out_features, in_features
    bf16 = _scaled_roof(spec, "bf16", efficiency, bandwidth_efficiency)
    fp8 = _scaled_roof(spec, "fp8", efficiency, bandwidth_efficiency)
    bf16_s = sum(bf16.time(op) for op in training_gemms(m, n, k, operand_bytes=2))
    fp8_gemm_s = sum(fp8.time(op) for op in training_gemms(m, n, k, operand_bytes=1))
    quant_bytes = QUANT_BYTES_PER_ELEMENT * (m * k + n * k + m * n)  # x, w, dy
    fp8_quant_s = quant_bytes / fp8.bandwidth
    return GemmCost(m, n, k, bf16_s, fp8_gemm_s, fp8_quant_s, fp8_gemm_s + fp8_quant_s)


def sweep(
    hidden_sizes: Iterable[int],
    tokens: int,
    spec: DeviceSpec,
    efficiency: float = 1.0,
    bandwidth_efficiency: float = 1.0,
) -> list[GemmCost]:
    """``linear_layer_cost`` of an MLP up-projection (in = h, out = 4h) for each hidden size h."""
    return [
        linear_layer_cost(tokens, h, 4 * h, spec, efficiency, bandwidth_efficiency)
        for h in hidden_sizes
    ]
