"""The FP8 GEMM: ``scaled_gemm`` (``torch._scaled_mm`` on FP8 GPUs) and ``emulated_gemm`` (the
same GEMM without FP8 units). ``FP8Linear`` (``fp8.linear``) runs its three GEMMs through here.

Where the GEMMs run (``scaled_gemm``):
    CUDA sm_89+   ``torch._scaled_mm`` (FP8 tensor cores; the second operand made column-major).
                  A GEMM with a dimension that is not a multiple of 16 (``_scaled_mm``'s rule;
                  TE asks only 8 of the token count) runs on the emulation path instead.
    CUDA < sm_89  a RuntimeError, unless emulation was asked for (``emulate=True`` on the
                  module, the ``autocast`` or the ``fp8`` policy): never a silent fallback.
    CPU           always the emulation. A CPU has no FP8 units, and ``torch._scaled_mm``'s CPU
                  kernel is itself an emulation whose speed depends on the CPU (on some Xeons it
                  is about 1000x slower than an FP32 matmul of the same shape), so it is never
                  called on a CPU: an FP8 GEMM costs an FP32 GEMM plus the widening casts.
    emulation     widen both FP8 operands to float32 (exact), float32 matmul, then multiply by
                  both scale inverses, add bias, round to the output dtype. Every product of two
                  FP8 values is exact in float32 (at most 4 x 4 significant bits, and far from
                  float32's exponent limits), so the only roundings are float32 accumulation,
                  the scaling and the output cast. The scales are applied to the accumulated sum,
                  as cuBLASLt does on the GPU (torch's CPU ``_scaled_mm`` scales the operands
                  first); both stay within float32 accumulation rounding of a float64 reference
                  (tested). Hopper's FP8 tensor cores accumulate in their own way, so GPU and CPU
                  agree to accumulation rounding, not bit for bit.
"""

from __future__ import annotations

import torch

__all__ = ["emulated_gemm", "scaled_gemm"]


def scaled_gemm(
    a: torch.Tensor,
    a_inv: torch.Tensor,
    b: torch.Tensor,
    b_inv: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
    emulate: bool = False,
) -> torch.Tensor:
    """``(a * a_inv) @ (b * b_inv) + bias`` for FP8 ``a`` (M, K), ``b`` (K, N), in ``out_dtype``.

    ``a_inv``/``b_inv`` are the scale inverses (0-d float32). On CUDA: ``torch._scaled_mm``
    unless ``emulate`` or a dimension is not a multiple of 16; elsewhere the emulation
    (module docstring), whose speed is that of a float32 matmul on the device at hand.
    """
    if not a.is_cuda or any(d % 16 for d in (*a.shape, b.shape[1])):
        emulate = True  # no FP8 units (CPU), or _scaled_mm's divisible-by-16 rule on CUDA
    if emulate:
        return emulated_gemm(a, a_inv, b, b_inv, bias, out_dtype)
    fused = bias is not None and out_dtype in (torch.bfloat16, torch.float16)
    out = torch._scaled_mm(
        a.contiguous(),
        b.t().contiguous().t(),
        scale_a=a_inv,
        scale_b=b_inv,
        bias=bias if fused else None,
        out_dtype=out_dtype,
    )
    return out + bias if bias is not None and not fused else out


def emulated_gemm(
    a: torch.Tensor,
    a_inv: torch.Tensor,
    b: torch.Tensor,
    b_inv: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The FP8 GEMM without FP8 units, in the GPU's order: exact FP8 products summed in float32,
    times ``a_inv * b_inv``, plus bias in float32, rounded once to ``out_dtype``. Autocast is
    switched off inside, so the matmul stays float32 even when called under BF16 autocast."""
    with torch.autocast(a.device.type, enabled=False):
        out = (a.float() @ b.float()) * (a_inv.float() * b_inv.float())
        return (out if bias is None else out + bias.float()).to(out_dtype)
