"""How close a GEMM of shape (M, N, K) gets to a GPU's peak: tiles, waves and the roofline.

A GPU computes ``C = A @ B`` (A is M x K, B is K x N) in output tiles of ``tile_m x tile_n``, one
tile per streaming multiprocessor (SM) at a time. Three things keep it below its datasheet peak:

- **Tile quantization.** A partial tile at the edge of C costs a whole tile: M = 2304 in tiles of
  128 rows is 18 tiles, exact; M = 2400 would be 19 tiles for 18.75 tiles of work.
- **Wave quantization.** Tiles run in waves of one per SM. 133 tiles on 132 SMs take two waves,
  the second with one SM busy, so the GEMM reaches about half its rate.
- **The roofline.** A GEMM must also read A and B and write C: when ``bytes / HBM bandwidth`` is
  longer than the math, memory sets the time (skinny or small GEMMs).

Beyond those, a large well-shaped GEMM in a training step still reaches only a ``ceiling``
fraction of peak (clock under load, the main loop's prologue and epilogue, instruction issue,
and whatever the cost model leaves out). The ceiling is per GPU and fitted to whole training
steps on declared runs: the A100's (0.695, with the A100's tile shape) on five rows of
Narayanan et al.'s Table 1 (``cluster.validation``), Hopper's (0.680, alone) on three runs of Megatron-Core's H100 table
(``cluster.validation_hopper``). A lone BF16 8192^3 GEMM measured once on an H200 (about 790
TFLOP/s, REFERENCE.md) gives 0.823 (tests/test_gemm_model.py derives it): an upper bound, as a training
step's GEMMs do not run alone. Blackwell reuses Hopper's fitted ceiling, an assumption.

``GemmModel.time(m, n, k, batch)`` is the time of one (batched) GEMM; ``layer_gemms`` lists the
GEMMs of one transformer layer on one TP rank (forward, backward and recomputed), and
``gemm_compute_time`` adds them up for a micro-batch. ``cost_terms.iteration_time`` and the
planner (``replica_cost.TrainingJob``) time GEMMs this way by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hardware import DeviceSpec

__all__ = [
    "A100_GEMM_CEILING",
    "A100_GEMM_TILE",
    "HOPPER_GEMM_CEILING",
    "GemmModel",
    "Gemm",
    "gemm_model_for",
    "layer_gemms",
    "logit_gemms",
    "gemm_compute_time",
]


@dataclass(frozen=True)
class Gemm:
    """One GEMM: ``batch`` independent products of (m x k) by (k x n)."""

    name: str
    m: float  # whole numbers, except for a work split evenly over ranks (``split="even"``)
    n: float
    k: float
    batch: float = 1

    def __post_init__(self) -> None:
        if min(self.m, self.n, self.k, self.batch) <= 0:
            raise ValueError(f"GEMM {self.name!r}: m, n, k and batch must be positive, got {self}.")

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
        if min(self.sms, self.tile_m, self.tile_n) < 1:
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
    split: str = "whole",
) -> list[Gemm]:
    """The GEMMs the busiest TP rank runs for one layer and one micro-batch, forward, backward
    and recomputed: QKV, attention scores (Q K^T) and values (P V) per head, the projection and
    the two MLP GEMMs, with Megatron's split (column-parallel QKV and fc1, row-parallel
    projection and fc2). ``split="whole"``: heads and FFN columns are whole units, so the
    busiest rank owns ceil(heads / t) heads and ceil(ffn / t) columns; ``"even"``: the work
    splits evenly (heads / t, fractional). ``recompute``: ``full`` runs every forward GEMM again,
    ``selective`` the two attention GEMMs."""
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}.")
    if split not in ("whole", "even"):
        raise ValueError(f"split must be 'whole' or 'even', got {split!r}.")
    t, b, s, h = tp, micro_batch, seq, hidden
    tokens, d = b * s, h // heads
    mine_heads = math.ceil(heads / t) if split == "whole" else heads / t
    mine_ffn = math.ceil(ffn / t) if split == "whole" else ffn / t
    forward = [
        Gemm("qkv", tokens, 3 * mine_heads * d, h),
        Gemm("scores", s, s, d, b * mine_heads),
        Gemm("values", s, d, s, b * mine_heads),
        Gemm("proj", tokens, h, mine_heads * d),
        Gemm("fc1", tokens, mine_ffn, h),
        Gemm("fc2", tokens, h, mine_ffn),
    ]
    gemms = list(forward)
    for g in forward:
        gemms.extend(_backward(g))
    if recompute == "full":
        gemms.extend(forward)
    elif recompute == "selective":
        gemms.extend(g for g in forward if g.name in ("scores", "values"))
    return gemms


def logit_gemms(
    hidden: int, vocab: int, seq: int, micro_batch: int, tp: int, split: str = "whole"
) -> list[Gemm]:
    """The vocabulary-parallel logit layer's GEMM and its two backward GEMMs on one rank."""
    rows = math.ceil(vocab / tp) if split == "whole" else vocab / tp
    g = Gemm("logits", micro_batch * seq, rows, hidden)
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
    split: str = "whole",
) -> float:
    """Seconds of GEMMs for one micro-batch on the busiest rank: ``layers`` layers plus
    ``logit_share`` of the logit layer (1 on the stage that holds it; the cost model spreads it,
    1/pp each). ``split``: see ``layer_gemms``."""
    gemms = layer_gemms(hidden, heads, seq, ffn, micro_batch, tp, recompute, split)
    per_layer = sum(gm.time(g, dtype) for g in gemms)
    logit = logit_gemms(hidden, vocab, seq, micro_batch, tp, split)
    logits = sum(gm.time(g, dtype) for g in logit)
    return layers * per_layer + logit_share * logits


# Calibrated ceilings (fraction of the datasheet peak a large GEMM reaches): fitted to A100 runs
# with cuBLAS's large Ampere output tile, 256 x 128, the lowest error of 128 x 128, 128 x 256 and
# 256 x 128 on the calibration rows (cluster.validation), and to Megatron-Core's H100 runs
# (cluster.validation_hopper); tests/test_gemm_model.py recomputes both.
A100_GEMM_TILE = (256, 128)
A100_GEMM_CEILING = 0.695
HOPPER_GEMM_CEILING = 0.680

# SMs: A100 108 and H100 SXM 132 (NVIDIA's architecture whitepapers), H100 PCIe 114, H200 132
# (the same GH100 die as H100 SXM), B200 148.
_SMS = {"A100": 108, "H100 PCIe": 114, "H100 SXM": 132, "H200": 132, "B200": 148, "GB200": 148}


def gemm_model_for(gpu: DeviceSpec, ceiling: float | None = None) -> GemmModel:
    """The ``GemmModel`` of a datasheet GPU (A100, H100 SXM/PCIe, H200, B200, GB200): its SM
    count and a ceiling (``ceiling`` overrides). The A100 gets the ceiling and tile fitted to
    A100 runs (``cluster.validation``); every other GPU the ceiling fitted to Megatron-Core's
    H100 runs (``cluster.validation_hopper``), an assumption for Blackwell, whose published
    end-to-end runs we have not fitted."""
    name = gpu.name
    sms = next((n for key, n in _SMS.items() if name.startswith(key)), None)
    if sms is None:
        raise ValueError(f"No SM count for {name!r}; known: {', '.join(_SMS)}.")
    if name.startswith("A100"):
        value = A100_GEMM_CEILING if ceiling is None else ceiling
        return GemmModel(gpu, sms, value, *A100_GEMM_TILE, source="A100: calibrated")
    value = HOPPER_GEMM_CEILING if ceiling is None else ceiling
    return GemmModel(gpu, sms, value, source="ceiling fitted to Megatron-Core's H100 runs")
