"""The FP8 GEMM: ``scaled_gemm`` (``torch._scaled_mm`` on FP8 GPUs) and ``emulated_gemm`` (the
same GEMM without FP8 units). ``FP8Linear`` (``fp8.linear``) runs its three GEMMs through here.

Where the GEMMs run (``scaled_gemm``):
    CUDA sm_89+   ``torch._scaled_mm`` (FP8 tensor cores; the second operand made column-major).
                  A GEMM with a dimension that is not a multiple of 16 (``_scaled_mm``'s rule,
                  stricter than the one ``FP8Linear`` checks, TE's: see ``fp8.linear``) runs on
                  the emulation path instead, with a RuntimeWarning once per pair of shapes.
                  Row-wise scales (an ``(M, 1)`` and a ``(1, N)`` scale inverse) use
                  ``_scaled_mm``'s row-wise mode, which returns BF16; the result is then cast.
                  The block recipe's tile-scaled GEMMs run through ``fp8.tiled_gemm`` (sm_90).
    CUDA < sm_89  a RuntimeError, unless emulation was asked for (``emulate=True`` on the
                  module, the ``autocast`` or the ``fp8`` policy): never a silent fallback.
    CPU           always the emulation. A CPU has no FP8 units, and ``torch._scaled_mm``'s CPU
                  kernel is itself an emulation whose speed depends on the CPU (on some Xeons it
                  is about 1000x slower than an FP32 matmul of the same shape), so it is never
                  called on a CPU: an FP8 GEMM costs an FP32 GEMM plus the widening casts.
    emulation     widen both FP8 operands to float32 (exact: every FP8 value is a float32),
                  float32 matmul, then multiply by both scale inverses, add bias, round to the
                  output dtype. Every product of two FP8 values is exact in float32 (at most 4 x 4
                  significant bits, and far from float32's exponent limits), so the roundings are
                  float32 accumulation, the scaling (the sum times ``a_inv * b_inv``, each
                  product rounded to float32) and the output cast. (The operands are never
                  dequantized on their own: ``fp8.dequantize``, an FP8 value times a float32
                  ``scale_inv``, rounds too, unless the scale is a power of two.) The scales are
                  applied to the accumulated sum, as cuBLASLt does on the GPU (torch's CPU
                  ``_scaled_mm`` scales the operands first); both stay within float32
                  accumulation rounding of a float64 reference (tested).
Accumulation (``use_fast_accum``, from the recipe's ``MMParams``: fast = not split; and how the
emulation sums, the recipe's ``accumulation``; ``emulated_sums`` is where both are applied):
    CUDA          passed to ``torch._scaled_mm(use_fast_accum=...)``, which sets cuBLASLt's
                  ``CUBLASLT_MATMUL_DESC_FAST_ACCUM``. TE's delayed scaling: fast for the forward
                  GEMM, split (partial sums promoted to float32) for dgrad and wgrad
                  (``DelayedScaling``). The tensor cores accumulate as the hardware does, so
                  ``accumulation`` changes nothing on a GPU, nor in the emulation there.
    emulation     ``accumulation="exact"`` (the default): float32 sums, so fast and split
                  accumulation give the same result, and GPU and CPU agree to accumulation
                  rounding, not bit for bit. ``"hopper"`` (on a CPU): the sums an H100's FP8
                  tensor cores compute (``fp8.mma``: blocks of 32 products aligned and truncated
                  to about 14 bits; split accumulation promotes to float32 every 128 elements
                  of K), fast or split as ``use_fast_accum`` says; much slower.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from .mma import PROMOTION, mma_accumulate, mma_block_scaled

__all__ = [
    "ACCUMULATIONS",
    "ScaledMMCall",
    "check_accumulation",
    "emulated_gemm",
    "emulated_sums",
    "scaled_gemm",
    "scaled_mm_call",
    "warn_emulated_once",
]

# How the emulation sums an FP8 GEMM (module docstring): float32, or as Hopper's tensor cores do.
ACCUMULATIONS = ("exact", "hopper")


def scaled_gemm(
    a: torch.Tensor,
    a_inv: torch.Tensor,
    b: torch.Tensor,
    b_inv: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    emulate: bool = False,
    use_fast_accum: bool = False,
    accumulation: str = "exact",
) -> torch.Tensor:
    """``(a * a_inv) @ (b * b_inv) + bias`` for FP8 ``a`` (M, K), ``b`` (K, N), in ``out_dtype``.

    ``a_inv``/``b_inv`` are the scale inverses: 0-d float32, or row-wise ``(M, 1)`` and
    ``(1, N)`` (the emulation broadcasts them the same way). On CUDA: ``torch._scaled_mm``
    (with ``use_fast_accum``) unless ``emulate`` or a dimension is not a multiple of 16;
    elsewhere the emulation (module docstring), summed as ``accumulation`` says: float32
    ("exact": a float32 matmul's speed, ``use_fast_accum`` changes nothing) or as Hopper does
    ("hopper", fast or split as ``use_fast_accum`` says).
    """
    if emulate or not _is_cuda(a):
        return emulated_gemm(a, a_inv, b, b_inv, bias, out_dtype, use_fast_accum, accumulation)
    if any(d % 16 for d in (*a.shape, b.shape[1])):  # _scaled_mm's rule on CUDA
        shapes = (tuple(a.shape), tuple(b.shape))
        warn_emulated_once(
            shapes,
            f"FP8 GEMM {shapes[0]} x {shapes[1]} on a GPU runs through the FP32 emulation, "
            "without FP8 speed: torch._scaled_mm needs every dimension to be a multiple of 16. "
            "Choose such sizes (widths, and batch x sequence) to run it on the FP8 tensor cores.",
        )
        return emulated_gemm(a, a_inv, b, b_inv, bias, out_dtype, use_fast_accum, accumulation)
    return scaled_mm_call(a, a_inv, b, b_inv, bias, out_dtype, use_fast_accum).run()


def _is_cuda(t: torch.Tensor) -> bool:
    return t.is_cuda


_WARNED: set[object] = set()


def warn_emulated_once(key: object, message: str) -> None:
    """A RuntimeWarning the first time ``key`` is met (say, a pair of GEMM shapes that falls back
    to the emulation on a GPU, or a recipe with no Hopper accumulation to model); silent
    afterwards."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


@dataclass(frozen=True)
class ScaledMMCall:
    """One ``torch._scaled_mm`` call as the GPU path makes it (``scaled_mm_call`` builds it),
    and what happens to its output: a cast to ``result_dtype``, then ``bias_after`` added in
    float32 where CUDA cannot fuse the bias (float32 output)."""

    mat_a: torch.Tensor  # (M, K) FP8, row-major
    mat_b: torch.Tensor  # (K, N) FP8, column-major
    scale_a: torch.Tensor  # float32: 0-d, or (M, 1) row-wise
    scale_b: torch.Tensor  # float32: 0-d, or (1, N) row-wise
    bias: torch.Tensor | None  # (N,) in out_dtype (BF16 or FP16 only), fused into the GEMM
    out_dtype: torch.dtype
    use_fast_accum: bool
    result_dtype: torch.dtype
    bias_after: torch.Tensor | None

    def run(self) -> torch.Tensor:
        out = torch._scaled_mm(
            self.mat_a,
            self.mat_b,
            scale_a=self.scale_a,
            scale_b=self.scale_b,
            bias=self.bias,
            out_dtype=self.out_dtype,
            use_fast_accum=self.use_fast_accum,
        ).to(self.result_dtype)
        if self.bias_after is None:
            return out
        return (out.float() + self.bias_after.float()).to(self.result_dtype)


def scaled_mm_call(
    a: torch.Tensor,
    a_inv: torch.Tensor,
    b: torch.Tensor,
    b_inv: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    use_fast_accum: bool,
) -> ScaledMMCall:
    """The arguments ``scaled_gemm`` hands ``torch._scaled_mm`` on a GPU: a pure function, so a
    test on any machine checks exactly what CUDA would receive (tests/cuda_contracts.py).

    CUDA's kernel wants the first operand row-major and the second column-major, float32
    scales, and a bias only with BF16 or FP16 output and in that dtype; row-wise scales return
    BF16 only (torchao asks for BF16 there too), and the result is then cast."""
    rowwise = a_inv.numel() > 1 or b_inv.numel() > 1
    mm_dtype = torch.bfloat16 if rowwise else out_dtype
    fused = bias is not None and mm_dtype in (torch.bfloat16, torch.float16)
    return ScaledMMCall(
        mat_a=a.contiguous(),
        mat_b=b.t().contiguous().t(),
        scale_a=a_inv.to(torch.float32).contiguous(),
        scale_b=b_inv.to(torch.float32).contiguous(),
        bias=bias.to(mm_dtype).contiguous() if fused and bias is not None else None,
        out_dtype=mm_dtype,
        use_fast_accum=use_fast_accum,
        result_dtype=out_dtype,
        bias_after=None if fused else bias,
    )


def emulated_gemm(
    a: torch.Tensor,
    a_inv: torch.Tensor,
    b: torch.Tensor,
    b_inv: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    use_fast_accum: bool = False,
    accumulation: str = "exact",
) -> torch.Tensor:
    """The FP8 GEMM without FP8 units, scaled as cuBLASLt scales: the sums of the exact FP8 products
    (``emulated_sums``: float32, or Hopper's with ``accumulation="hopper"``), times
    ``a_inv * b_inv`` (a rounding), plus bias in float32, rounded to ``out_dtype``. Autocast is
    switched off inside, so the matmul stays float32 even under BF16 autocast."""
    with torch.autocast(a.device.type, enabled=False):
        sums = emulated_sums(a, b.t(), use_fast_accum, accumulation)
        out = sums * (a_inv.float() * b_inv.float())
        return (out if bias is None else out + bias.float()).to(out_dtype)


def emulated_sums(
    a: torch.Tensor,
    b: torch.Tensor,
    use_fast_accum: bool = False,
    accumulation: str = "exact",
    k_tile_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``a @ b^T`` for FP8 ``a`` (M, K) and ``b`` (N, K) as float32 sums: how every emulated FP8
    GEMM with FP8 operands accumulates (the block recipe's too), chosen here and nowhere else.

    ``k_tile_scales``: ``(a_scales (M, T), b_scales (N, T))``, one float32 scale per row and
    128-wide tile of K (the block recipe's), applied inside the sum. ``accumulation``:
        "exact"   a float32 matmul of the products (of the elements times their tile scales,
                  exact for power-of-two scales); ``use_fast_accum`` changes nothing.
        "hopper"  on a CPU, the sums of an H100's tensor cores (``fp8.mma``): one chain over K
                  if ``use_fast_accum``, else a float32 promotion every 128 elements; with tile
                  scales, each tile's chain scaled and added in float32. On other devices
                  "exact": a GPU's native FP8 GEMMs accumulate on its own tensor cores, and its
                  float32 emulation (``emulate=True``, shapes off the 16-grid) stays float32.
    """
    check_accumulation(accumulation, "emulated_sums")
    if accumulation == "hopper" and a.device.type == "cpu":
        if k_tile_scales is None:
            return mma_accumulate(a, b, fast_accum=use_fast_accum)
        return mma_block_scaled(a, k_tile_scales[0], b, k_tile_scales[1])
    a_vals, b_vals = a.float(), b.float()
    if k_tile_scales is not None:
        k = a.shape[1]
        a_vals = a_vals * k_tile_scales[0].repeat_interleave(PROMOTION, 1)[:, :k]
        b_vals = b_vals * k_tile_scales[1].repeat_interleave(PROMOTION, 1)[:, :k]
    return a_vals @ b_vals.t()


def check_accumulation(accumulation: object, who: str) -> None:
    """A ValueError unless ``accumulation`` is one of ``ACCUMULATIONS``."""
    if accumulation not in ACCUMULATIONS:
        raise ValueError(
            f"{who}: accumulation={accumulation!r}; use 'exact' (float32 sums) or 'hopper' "
            "(the sums of an H100's FP8 tensor cores, fp8.mma)."
        )
