"""The block recipe's GEMMs on Hopper's FP8 tensor cores: torch's blockwise scaled GEMM.

``Float8BlockScaling`` (DeepSeek-V3's scheme) scales 1x128 tiles of activations and gradients
and 128x128 tiles of weights. cuBLAS 12.9 applies such tile scales inside the GEMM on sm_90, and
torch exposes it as ``torch.nn.functional.scaled_mm`` with ``ScalingType.BlockWise1x128`` and
``BlockWise128x128`` (``torch._scaled_mm_v2``). ``block_scaled_mm_call(a, b, ...).run()``
computes ``a @ b^T`` for two ``QuantizedTensor``s quantized along their shared last dimension K,
as ``linear_function``'s ``quantized_matmul`` does in emulation:

    forward   x (1x128) @ w (128x128)^T        dgrad   dy (1x128) @ w_col (128x128)^T
    wgrad     dy_col (1x128) @ x_col (1x128)^T

The operand layouts torch's kernel reads (its checks in ``aten/src/ATen/native/cuda/
ScaledBlas.cpp``, ``_scaled_block1x128_block128x128`` and the two others; the function and
``ScalingType`` exist from torch 2.10, which ``native.check_recipe_device`` checks):
    data      ``mat_a`` (M, K) row-major, ``mat_b`` (K, N) column-major (b's (N, K) transposed)
    1x128     float32 scales (rows, ceil(K/128)), *outer-dim-major*: strides (1, rows)
    128x128   float32 scales (ceil(rows/128), ceil(K/128)), the K dimension padded to a multiple
              of 4 and stored transposed: shape (round_up(ceil(K/128), 4), ceil(rows/128)),
              strides (1, round_up(ceil(K/128), 4)); the padding is never read
``block_scale_operand`` builds them. Both operands must be E4M3 (the kernel's rule), and here
every dimension a multiple of 128: torch accepts partial tiles (multiples of 16), but its own GPU
tests use whole ones, so until a GPU run checks partial tiles they take the emulation, with a
warning, like ``fp8.gemm.scaled_gemm`` off its grid. The output is asked for in the GEMM's dtype
(BF16 forward and dgrad, float32 wgrad; torch tests both). A bias is fused where the output is
BF16 or FP16 (torch refuses a bias with float32 output): the kernel adds it, cast to that dtype,
in its epilogue, one rounding more than the emulation's float32 bias; with float32 output it is
added afterwards in float32, as the emulation does.

This path is exercised on a CPU only through a fake of torch's kernel that applies its checks
and the layouts' meaning (``tests/test_fp8_tiled_gemm.py``); ``benchmarks/fp8.py`` compares it
with the emulation on a real sm_90 GPU (``fp8_recipe_gemm`` rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .quantizers import QuantizedTensor
from .quantizers.base import as_matrix

__all__ = [
    "BLOCK_SCALING",
    "BlockScaledMMCall",
    "block_scale_operand",
    "block_scaled_mm_call",
    "native_block_problem",
]

# our tile -> the name of torch's ScalingType member
BLOCK_SCALING = {(1, 128): "BlockWise1x128", (128, 128): "BlockWise128x128"}


def block_scale_operand(scale_inv: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """One operand's tile scales (``QuantizedTensor.scale_inv``, the logical ``(row tiles,
    K tiles)`` grid) in the layout torch's blockwise kernel reads (module docstring)."""
    scale = scale_inv.to(torch.float32)
    if tile == (1, 128):
        return scale.t().contiguous().t()  # (rows, K tiles), strides (1, rows)
    if tile == (128, 128):
        row_tiles, k_tiles = scale.shape
        padded = scale.new_ones(row_tiles, 4 * math.ceil(k_tiles / 4))
        padded[:, :k_tiles] = scale
        return padded.t()  # (K tiles padded to 4k, row tiles), strides (1, padded K tiles)
    raise ValueError(f"block_scale_operand: tile {tile} is not one of {list(BLOCK_SCALING)}.")


def native_block_problem(a: QuantizedTensor, b: QuantizedTensor) -> str | None:
    """Why torch's blockwise kernel cannot multiply ``a @ b^T`` (None: it can)."""
    if a.fmt != "E4M3" or b.fmt != "E4M3":
        return f"torch's blockwise kernel takes E4M3 operands only, not {a.fmt} x {b.fmt}"
    if a.tile not in BLOCK_SCALING or b.tile not in BLOCK_SCALING:
        return f"tiles {a.tile} x {b.tile} are not 1x128 or 128x128"
    if a.tile == b.tile == (128, 128):
        return "two 128x128-tiled operands (no kernel multiplies them)"
    (m, k), n = as_matrix(a.data).shape, as_matrix(b.data).shape[0]
    if any(d % 128 for d in (m, k, n)):
        return (
            f"a dimension of the ({m}, {k}) x ({k}, {n}) GEMM is not a multiple of 128 (torch "
            "accepts partial tiles, but only whole ones are tested on GPUs)"
        )
    return None


@dataclass(frozen=True)
class BlockScaledMMCall:
    """One call of torch's blockwise GEMM (``torch.nn.functional.scaled_mm``) as the GPU path
    makes it (``block_scaled_mm_call`` builds it), and the float32 bias added after it where the
    output is float32 (CUDA fuses a bias only into BF16 or FP16 output)."""

    mat_a: torch.Tensor  # (M, K) E4M3, row-major
    mat_b: torch.Tensor  # (K, N) E4M3, column-major
    scale_a: torch.Tensor  # block_scale_operand's layout
    recipe_a: str  # a ScalingType member's name (BLOCK_SCALING)
    scale_b: torch.Tensor
    recipe_b: str
    bias: torch.Tensor | None  # (N,) in out_dtype, fused
    out_dtype: torch.dtype
    use_fast_accum: bool
    bias_after: torch.Tensor | None

    def run(self) -> torch.Tensor:
        from torch.nn.functional import ScalingType, scaled_mm

        out = scaled_mm(
            self.mat_a,
            self.mat_b,
            self.scale_a,
            getattr(ScalingType, self.recipe_a),
            self.scale_b,
            getattr(ScalingType, self.recipe_b),
            bias=self.bias,
            output_dtype=self.out_dtype,
            use_fast_accum=self.use_fast_accum,
        )
        if self.bias_after is None:
            return out
        return (out.float() + self.bias_after.float()).to(self.out_dtype)


def block_scaled_mm_call(
    a: QuantizedTensor,
    b: QuantizedTensor,
    out_dtype: torch.dtype,
    use_fast_accum: bool = False,
    bias: torch.Tensor | None = None,
) -> BlockScaledMMCall:
    """The arguments of torch's blockwise kernel for ``a @ b^T (+ bias)``, ``(M, K) x (N, K) ->
    (M, N)`` in ``out_dtype``, the tile scales applied inside the GEMM (``.run()`` calls it on
    the GPU's FP8 tensor cores; the caller checks ``native_block_problem`` first): a pure
    function, so a test on any machine checks exactly what CUDA would receive."""
    fused = bias is not None and out_dtype in (torch.bfloat16, torch.float16)
    return BlockScaledMMCall(
        mat_a=as_matrix(a.data).contiguous(),
        mat_b=as_matrix(b.data).contiguous().t(),
        scale_a=block_scale_operand(a.scale_inv, a.tile),
        recipe_a=BLOCK_SCALING[a.tile],
        scale_b=block_scale_operand(b.scale_inv, b.tile),
        recipe_b=BLOCK_SCALING[b.tile],
        bias=bias.to(out_dtype).contiguous() if fused and bias is not None else None,
        out_dtype=out_dtype,
        use_fast_accum=use_fast_accum,
        bias_after=None if fused else bias,
    )
