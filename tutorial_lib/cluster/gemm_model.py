"""How close a GEMM of shape (M, N, K) gets to a GPU's peak: tiles, waves and the roofline.

A GPU computes ``C = A @ B`` (A is M x K, B is K x N) in output tiles of ``tile_m x tile_n``, one
tile per streaming multiprocessor (SM) at a time. Three things keep it below its datasheet peak:

- **Tile quantization.** A partial tile at the edge of C costs a whole tile: M = 2304 in tiles of
  128 rows is 18 tiles, exact; M = 2400 would be 19 tiles for 18.75 tiles of work.
- **Wave quantization.** Tiles run in waves of one per SM. 133 tiles on 132 SMs take two waves,
  the second with one SM busy, so the GEMM reaches about half its rate.
- **The roofline.** A GEMM must also read A and B and write C: when ``bytes / HBM bandwidth`` is
  longer than the math, memory sets the time (skinny or small GEMMs).

Beyond those, a large well-shaped GEMM still reaches only a ``ceiling`` fraction of peak (clock
under load, the main loop's prologue and epilogue, instruction issue). The ceiling is per GPU and
sourced: on Hopper, the BF16 8192^3 GEMM measured once on an H200 (about 790 TFLOP/s, REFERENCE.md)
divided by this model's own tile and wave factors for that shape; on the A100, fitted to the
declared calibration rows of ``cluster.validation`` (one parameter).

``GemmModel.time(m, n, k, batch)`` is the time of one (batched) GEMM; ``layer_gemms`` lists the
GEMMs of one transformer layer on one TP rank (forward, backward and recomputed), and
``gemm_compute_time`` adds them up for a micro-batch. ``cost_terms.iteration_time(gemm=...)``
uses it in place of a single ``compute_efficiency``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hardware import DeviceSpec

__all__ = [
    "GemmModel",
    "Gemm",
    "GEMM_MODELS",
    "H200_BF16_8192_TFLOPS",
    "gemm_model_for",
    "layer_gemms",
    "logit_gemms",
    "gemm_compute_time",
]

# REFERENCE.md: measured once on an H200 (CUDA torch): a BF16 8192^3 GEMM at about 790 TFLOP/s.
H200_BF16_8192_TFLOPS = 790.0


@dataclass(frozen=True)
class Gemm:
    """One GEMM: ``batch`` independent products of (m x k) by (k x n)."""

    name: str
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class GemmModel:
    """Tile, wave and roofline model of one GPU's GEMMs (module docstring).

    sms: streaming multiprocessors (A100 108, H100/H200 SXM 132: NVIDIA's architecture
        whitepapers; B200 148, from NVIDIA's Blackwell tuning guide's SM count, 2 x 74).
    tile_m, tile_n: output tile of the kernel; 128 x 256 is CUTLASS's and cuBLAS's usual large
        BF16 tile on both Ampere and Hopper (an assumption: the library picks per shape).
    ceiling: fraction of peak a large GEMM reaches after tile and wave quantization.
    """

    gpu: DeviceSpec
    sms: int
    ceiling: float
    tile_m: int = 128
    tile_n: int = 256
    source: str = ""

    def __post_init__(self) -> None:
        if self.sms < 1 or self.tile_m < 1 or self.tile_n < 1:
            raise ValueError("sms, tile_m and tile_n must be positive integers.")
        if not 0 < self.ceiling <= 1:
            raise ValueError(f"ceiling must be in (0, 1], got {self.ceiling}.")

    def quantization(self, g: Gemm) -> float:
        """Useful work over the work of the tiles and waves the GEMM occupies (<= 1)."""
        tiles = g.batch * math.ceil(g.m / self.tile_m) * math.ceil(g.n / self.tile_n)
        waves = math.ceil(tiles / self.sms)
        return g.batch * g.m * g.n / (waves * self.sms * self.tile_m * self.tile_n)

    def time(self, g: Gemm, dtype: str = "bf16") -> float:
        """Seconds: the longer of the quantized math at ``ceiling`` x peak and the bytes of A, B
        and C (2 bytes each, 1 for FP8 operands) at HBM bandwidth."""
        peak = self.gpu.peak(dtype)
        if peak is None:
            raise ValueError(f"{self.gpu.name} has no {dtype} peak.")
        math_s = g.flops / (peak * self.ceiling * self.quantization(g))
        operand = 1 if dtype == "fp8" else 2
        nbytes = g.batch * (operand * (g.m * g.k + g.k * g.n) + 2 * g.m * g.n)
        return max(math_s, nbytes / self.gpu.hbm_bandwidth)

    def efficiency(self, g: Gemm, dtype: str = "bf16") -> float:
        """Achieved fraction of peak: FLOPs / (time x peak)."""
        return g.flops / (self.time(g, dtype) * self.gpu.peak(dtype))  # type: ignore[operator]


def _backward(g: Gemm) -> tuple[Gemm, Gemm]:
    """C = A B (m x k by k x n): dA = dC B^T is (m, k) over n; dB = A^T dC is (k, n) over m."""
    return (
        Gemm(g.name + " dgrad", g.m, g.k, g.n, g.batch),
        Gemm(g.name + " wgrad", g.k, g.n, g.m, g.batch),
    )


def layer_gemms(
    hidden: int,
    heads: int,
    seq: int,
    ffn: int,
    micro_batch: int,
    tp: int,
    recompute: str = "none",
) -> list[Gemm]:
    """The GEMMs one TP rank runs for one layer and one micro-batch, forward, backward and
    recomputed: QKV, attention scores (Q K^T) and values (P V) per head, the projection and the
    two MLP GEMMs, with Megatron's split (column-parallel QKV and fc1, row-parallel projection
    and fc2; heads split over ranks). ``recompute``: ``full`` runs every forward GEMM again,
    ``selective`` the two attention GEMMs."""
    t, b, s, h = tp, micro_batch, seq, hidden
    tokens, d = b * s, h // heads
    local_heads = b * math.ceil(heads / t)
    forward = [
        Gemm("qkv", tokens, 3 * h // t, h),
        Gemm("scores", s, s, d, local_heads),
        Gemm("values", s, d, s, local_heads),
        Gemm("proj", tokens, h, h // t),
        Gemm("fc1", tokens, ffn // t, h),
        Gemm("fc2", tokens, h, ffn // t),
    ]
    gemms = list(forward)
    for g in forward:
        gemms.extend(_backward(g))
    if recompute == "full":
        gemms.extend(forward)
    elif recompute == "selective":
        gemms.extend(g for g in forward if g.name in ("scores", "values"))
    return gemms


def logit_gemms(hidden: int, vocab: int, seq: int, micro_batch: int, tp: int) -> list[Gemm]:
    """The vocabulary-parallel logit layer's GEMM and its two backward GEMMs on one rank."""
    g = Gemm("logits", micro_batch * seq, math.ceil(vocab / tp), hidden)
    return [g, *_backward(g)]


def gemm_compute_time(
    gm: GemmModel,
    hidden: int,
    heads: int,
    seq: int,
    ffn: int,
    vocab: int,
    layers: float,
    micro_batch: int,
    tp: int,
    recompute: str = "none",
    dtype: str = "bf16",
    logit_share: float = 1.0,
) -> float:
    """Seconds of GEMMs for one micro-batch on one rank: ``layers`` layers plus ``logit_share``
    of the logit layer (1 on the stage that holds it; the cost model spreads it, 1/pp each)."""
    per_layer = sum(
        gm.time(g, dtype) for g in layer_gemms(hidden, heads, seq, ffn, micro_batch, tp, recompute)
    )
    logits = sum(gm.time(g, dtype) for g in logit_gemms(hidden, vocab, seq, micro_batch, tp))
    return layers * per_layer + logit_share * logits


def _hopper_ceiling(gpu: DeviceSpec, sms: int) -> float:
    """The ceiling that makes the model give the measured H200 BF16 8192^3 rate."""
    probe = GemmModel(gpu, sms, 1.0)
    g = Gemm("probe", 8192, 8192, 8192)
    return H200_BF16_8192_TFLOPS * 1e12 / (gpu.peak("bf16") * probe.quantization(g))  # type: ignore[operator]


def gemm_model_for(gpu: DeviceSpec, ceiling: float | None = None) -> GemmModel:
    """The ``GemmModel`` of a datasheet GPU (A100, H100 SXM, H200, B200, GB200): its SM count and
    a ceiling (``ceiling`` overrides; A100's default is the calibrated one, others use the
    measured Hopper ceiling, the only one recorded)."""
    from .validation import A100_GEMM_CEILING

    name = gpu.name
    sms = 108 if name.startswith("A100") else 148 if name.startswith(("B200", "GB200")) else 132
    if ceiling is None:
        if name.startswith("A100"):
            ceiling, source = A100_GEMM_CEILING, "calibrated on cluster.validation's rows"
        else:
            ceiling = _hopper_ceiling(gpu, 132)
            source = "H200 BF16 8192^3 measured at about 790 TFLOP/s (REFERENCE.md)"
    else:
        source = "given"
    return GemmModel(gpu, sms, min(1.0, ceiling), source=source)


GEMM_MODELS: dict[str, str] = {
    "A100": "108 SMs (NVIDIA A100 whitepaper); ceiling calibrated (cluster.validation)",
    "H100 SXM": "132 SMs (NVIDIA H100 whitepaper, SXM5); ceiling from the H200 measurement",
    "H200": "132 SMs (same GH100 die as H100 SXM); ceiling measured on an H200",
    "B200": "148 SMs; ceiling assumed equal to Hopper's (no Blackwell measurement recorded)",
}
