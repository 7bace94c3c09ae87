"""NVFP4 (TE's ``NVFP4BlockScaling``): E2M1 elements, two levels of scales.

Level 1: each block of 16 elements along the last dimension (16x16 tiles for weights) has an
E4M3 scale. Level 2: the whole tensor has a float32 scale, ``S_enc = 448 * 6 / amax``, which
stretches the block scales over E4M3's range. A value is stored as
``e2m1(x * enc_b)`` and read back as ``value * s_b * amax / 2688`` (2688 = 448 * 6).

Every rule below follows TE's kernels (``common/cast/nvfp4/core_nvfp4.cuh``,
``dequantize_nvfp4.cuh``) and its Python reference (``pytorch/custom_recipes/
reference_nvfp4.py``), in float32:

    amax     ``max|x|`` over the tensor, NaN skipped (``fmaxf``)
    S_enc    ``min(2688 / amax, FLT_MAX)``; 1 when amax is 0 or inf
    s_b      ``e4m3(min(amax_b * (S_enc * float32(1/6)), FLT_MAX))``, RNE, saturating at 448
    enc_b    ``min(1 / (float(s_b) * (1 / S_enc)), FLT_MAX)`` (a zero block: FLT_MAX)
    data     E2M1 of ``clamp(x * enc_b, -6, 6)``: nearest, ties to even (``fp4.e2m1_codes``)
    decode   ``value * ((s_b * amax) * float32(1/2688))``, left to right, as TE's dequantize
             kernel (TE 2.9 to 2.20). ``s_b * amax`` overflows to inf in every block with
             ``s_b > FLT_MAX / amax``; the block holding the amax has s_b = 448, so this
             happens as soon as amax > FLT_MAX / 448, about 7.6e35 (float32 or BF16 input).
             TE then returns +-inf for such a block's non-zero elements and NaN (0 * inf) for
             its zeros, and so do we; the data and scales themselves are fine. The other
             association, ``s_b * (amax * float32(1/2688))``, stays finite there and differs
             by an ulp on many elements. (``tensor_scale_inv = amax * float32(1/2688)`` is the
             per-tensor factor the emulated GEMM applies after its sums.)

Options (TE's recipe turns them on per tensor; here they are off unless asked for):
    rht: multiply every 16-element block by the 16x16 random Hadamard matrix ``fp4.rht_matrix``
        before quantizing (amax taken after it); ``dequantize`` multiplies by its transpose.
        The sums are float32; for a BF16 input they are rounded to BF16 before the amax and
        the casts, as TE does (TE 2.9 to 2.20: ``hadamard_transform.cu`` writes BF16, the
        fused cast rounds "for bit-wise compatibility", ``reference_nvfp4.py`` multiplies in
        ``x.dtype``). TE's kernels take BF16 input only; an FP16 input is rounded to FP16, as
        TE's reference does, and float32 (or float64) input keeps float32.
        TE applies it to the column-wise copy of inputs and gradients (the wgrad GEMM operands),
        never to weights or row-wise copies; needs ``cols % 16 == 0`` and 1x16 blocks.
    stochastic_rounding: round each element to a random neighbour, unbiased (TE does this for
        gradients); ``generator`` (a seeded ``torch.Generator``) makes it reproducible.

``data`` holds unpacked E2M1 codes, one uint8 per element (TE packs two per byte).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..formats import E4M3, quantize
from ..scaling import FLT_MAX
from .base import (
    QuantizedTensor,
    Quantizer,
    as_matrix,
    check_input,
    expand_tiles,
    tensor_amax,
    tile_amax,
)
from .fp4 import E2M1_MAX, RHT_SIZE, e2m1_codes, e2m1_codes_stochastic, rht_matrix

__all__ = ["NVFP4Quantizer", "NVFP4_BLOCK", "global_encode_scale"]

NVFP4_BLOCK = 16
_FP8_TIMES_FP4_MAX = E4M3.max * E2M1_MAX  # 2688


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def global_encode_scale(amax: torch.Tensor) -> torch.Tensor:
    """``S_enc`` from the tensor amax (TE's ``compute_global_encode_scaling_factor_FP4``):
    ``2688 / amax`` in float32, capped at FLT_MAX; 1 when amax is 0 or the quotient is 0."""
    s = torch.minimum(_f32(_FP8_TIMES_FP4_MAX, amax) / amax, _f32(FLT_MAX, amax))
    return torch.where((amax == 0) | (s == 0), torch.ones_like(s), s)


@dataclass(frozen=True, eq=False)
class NVFP4Quantizer(Quantizer):
    """TE's ``NVFP4BlockScaling`` for one operand (module docstring for every rule).

    Fields:
        block_2d: 16x16 tiles (True) or 1x16 (False); None takes the recipe's default, 16x16
            for weights only (``fp4_quant_fwd_weight.fp4_2d_quantization``).
        rht: apply the random Hadamard transform first (default False).
        stochastic_rounding: stochastic instead of nearest rounding (default False).
        generator: the ``torch.Generator`` stochastic rounding draws from (None: global).
    Result: ``data`` uint8 E2M1 codes, ``scale_inv`` the E4M3 block scales (one per tile),
    ``tensor_scale_inv`` the float32 ``amax / 2688``, ``amax`` the tensor amax.
    """

    recipe = "nvfp4"
    te_name = "NVFP4BlockScaling"
    block_2d: bool | None = None
    rht: bool = False
    stochastic_rounding: bool = False
    generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_2d is None:
            object.__setattr__(self, "block_2d", self.role == "weight")
        if self.rht and self.block_2d:
            raise ValueError(
                "rht=True needs 1x16 blocks: TE applies the random Hadamard transform to "
                "inputs and gradients, never to 16x16-block weights. Pass block_2d=False."
            )

    @property
    def tile(self) -> tuple[int, int]:
        return (NVFP4_BLOCK, NVFP4_BLOCK) if self.block_2d else (1, NVFP4_BLOCK)

    def _transformed(self, m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``m`` (float32) with the RHT applied to each 16-element block; for a BF16 or FP16
        input (``dtype``) the float32 result is rounded to that dtype (module docstring)."""
        if not self.rht:
            return m
        if m.shape[1] % RHT_SIZE:
            raise ValueError(
                f"rht=True needs the last dimension divisible by {RHT_SIZE} (TE's rule), got "
                f"{m.shape[1]}."
            )
        rows, cols = m.shape
        out = (m.reshape(rows, -1, RHT_SIZE) @ rht_matrix(m.device)).reshape(rows, cols)
        if dtype in (torch.bfloat16, torch.float16):
            out = out.to(dtype).to(torch.float32)
        return out

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        check_input(x, "NVFP4Quantizer")
        tile, m = self.tile, self._transformed(as_matrix(x).to(torch.float32), x.dtype)
        amax = tensor_amax(m)
        s_enc = global_encode_scale(amax)
        block_amax = tile_amax(m, tile)
        s_dec_b = torch.minimum(block_amax * (s_enc * _f32(1 / E2M1_MAX, m)), _f32(FLT_MAX, m))
        s_b = quantize(s_dec_b, E4M3, 1.0)  # E4M3, RNE, saturating at 448
        s_dec = _f32(1.0, m) / s_enc
        enc_b = torch.minimum(_f32(1.0, m) / (s_b.to(torch.float32) * s_dec), _f32(FLT_MAX, m))
        v = (m * expand_tiles(enc_b, tile, m.shape)).clamp(-E2M1_MAX, E2M1_MAX)
        if self.stochastic_rounding:
            codes = e2m1_codes_stochastic(v, self.generator)
        else:
            codes = e2m1_codes(v)
        return self._result(
            x,
            data=codes.reshape(x.shape),
            scale_inv=s_b,
            fmt="E2M1",
            tile=tile,
            amax=amax,
            tensor_scale_inv=amax * _f32(1 / _FP8_TIMES_FP4_MAX, m),
            rht=self.rht,
        )
