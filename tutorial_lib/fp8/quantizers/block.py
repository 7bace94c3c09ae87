"""FP8 with a scale per tile: TE's ``Float8BlockScaling`` (Hopper) and ``MXFP8BlockScaling``.

    block   1x128 tiles for input and grad_output, 128x128 for weights; float32 scales,
            powers of two by default; E4M3 in both passes by default
    mxfp8   1x32 blocks along the last dimension; each scale an E8M0 exponent (a power of
            two) rounded *up*, so no element saturates; E4M3 by default

Ours accept any shape: the last tile of each dimension is padded with zeros for its amax and
cut off again. TE's quantizers refuse what is not a whole number of tiles (both the last
dimension and the product of the others divisible by 128, or by 32 for MXFP8).
Both TE recipes also keep a column-wise copy for the backward GEMMs, quantized from the
high-precision tensor rather than transposed; here that copy is ``quantize(x.T)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import quantize
from ..scaling import Format
from .base import (
    FP8Quantizer,
    QuantizedTensor,
    as_matrix,
    check_input,
    expand_tiles,
    scale_from_amax,
    tensor_amax,
    tile_amax,
)

__all__ = [
    "BlockQuantizer",
    "MXFP8Quantizer",
    "BLOCK_LEN",
    "MXFP8_BLOCK",
    "float_to_e8m0",
    "e8m0_quantize_multiplier",
]

BLOCK_LEN = 128  # Float8BlockScaling's tile edge
MXFP8_BLOCK = 32  # OCP MX block size


@dataclass(frozen=True, eq=False)
class BlockQuantizer(FP8Quantizer):
    """TE's ``Float8BlockScaling``: one float32 scale per 1x128 or 128x128 tile.

    Fields (TE's recipe defaults; ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES`` is not read):
        fp8_format: ``Format.E4M3`` (default, both passes) or ``Format.HYBRID`` (E5M2 grads).
        power_2_scale: True (default): scales rounded down to powers of two.
        amax_epsilon: 0.0 (default): a floor on each tile's amax.
        block_scaling_dim: 1 (1x128 tiles) or 2 (128x128); None takes the recipe's default for
            the role: ``x_block_scaling_dim=1``, ``w_block_scaling_dim=2``,
            ``grad_block_scaling_dim=1``.
    Each tile's scale follows ``scale_from_amax`` (TE's ``compute_scale_from_types``): an
    all-zero tile gets scale 1, a tile holding inf gets scale 1 (inf saturates to max), NaN is
    skipped by the amax and stays NaN, and an infinite quotient becomes the input dtype's max.
    ``scale_inv`` is ``1 / scale`` per tile, in the logical grid layout (TE hands cuBLAS the
    1x128 scales transposed and padded to a multiple of 4; that is storage, not arithmetic).
    """

    recipe = "block"
    te_name = "Float8BlockScaling"
    fp8_format: Format | str = Format.E4M3
    power_2_scale: bool = True
    amax_epsilon: float = 0.0
    block_scaling_dim: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_scaling_dim is None:
            object.__setattr__(self, "block_scaling_dim", 2 if self.role == "weight" else 1)
        if self.block_scaling_dim not in (1, 2):
            raise ValueError(f"block_scaling_dim must be 1 or 2, got {self.block_scaling_dim!r}.")
        if not self.amax_epsilon >= 0.0:
            raise ValueError(f"amax_epsilon must be >= 0, got {self.amax_epsilon!r}.")

    @property
    def tile(self) -> tuple[int, int]:
        return (BLOCK_LEN, BLOCK_LEN) if self.block_scaling_dim == 2 else (1, BLOCK_LEN)

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        check_input(x, "BlockQuantizer")
        fmt, tile, m = self.element_format, self.tile, as_matrix(x)
        amax = tile_amax(m, tile)
        dtype = torch.float32 if x.dtype == torch.float64 else x.dtype  # float64 is cast first
        scale = scale_from_amax(
            amax,
            fmt.max,
            power_2=self.power_2_scale,
            epsilon=self.amax_epsilon,
            value_for_inf=torch.finfo(dtype).max,
        )
        data = quantize(m, fmt, expand_tiles(scale, tile, m.shape))
        return self._result(
            x,
            data=data.reshape(x.shape),
            scale_inv=torch.reciprocal(scale),
            fmt=fmt.name,
            tile=tile,
            amax=tensor_amax(m),
        )


def float_to_e8m0(v: torch.Tensor) -> torch.Tensor:
    """The biased E8M0 exponent (uint8) of the smallest power of two ``>= v`` (``v >= 0``).

    TE's ``float_to_e8m0`` (``common/util/ptx_arch_spec.cuh`` in TE 2.20;
    ``cvt.rp.satfinite.ue8m0x2.f32`` on Blackwell), read from the float32 bits of ``v``:
        a normal ``v`` keeps its exponent field if it is a power of two, else the next one up;
        subnormal ``v``: code 0 (``2^-127``) up to ``2^-127``, else code 1 (``2^-126``);
        ``v = 0`` gives code 0; the result saturates at 254 (``2^127``; inf too);
        NaN gives 255, E8M0's NaN.
    """
    bits = v.to(torch.float32).contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    normal = exponent + (mantissa != 0).to(exponent.dtype)
    subnormal = (mantissa > (1 << 22)).to(exponent.dtype)  # above 2^-127 needs 2^-126
    code = torch.where(exponent == 0, subnormal, normal).clamp(max=254)
    return torch.where(torch.isnan(v), 255, code).to(torch.uint8)


def e8m0_quantize_multiplier(code: torch.Tensor) -> torch.Tensor:
    """What a block's elements are multiplied by before the cast, as float32: ``2^(127 - code)``
    for every code from 0 to 254, exact (code 0 gives ``2^127``, code 254 the subnormal
    ``2^-127``), and NaN for code 255, E8M0's NaN.

    TE's ``exp2f_rcp`` (``common/util/ptx.cuh``) since TE 2.13 (PR #2647), still so in TE 2.20.
    Before, code 0 gave 1, so a block with a tiny amax (code 0) flushed to zero, and code 254
    gave 0 (the float bits ``(254 - code) << 23``), so inf became NaN instead of max.
    """
    e = code.to(torch.int32)
    multiplier = torch.ldexp(torch.ones_like(e, dtype=torch.float32), 127 - e)
    return torch.where(e == 255, torch.full_like(multiplier, float("nan")), multiplier)


@dataclass(frozen=True, eq=False)
class MXFP8Quantizer(FP8Quantizer):
    """TE's ``MXFP8BlockScaling`` (OCP MX): 32 consecutive elements share an E8M0 scale.

    Fields: fp8_format: ``Format.E4M3`` (default, both passes) or ``Format.HYBRID`` (E5M2 for
    grad_output), as the recipe. (TE's ``enable_2d_quantization`` for weights is not offered.)
    Per block of 32 along the last dimension (TE's MXFP8 cast kernels):
        amax: ``max|block|``, NaN skipped (``fmaxf``);
        code: ``float_to_e8m0(amax * float32(1 / fmt.max))``, the exponent rounded *up*, so
            ``|x| * 2^(127 - code) <= fmt.max``: no element of a finite block saturates;
        data: ``fmt(x * e8m0_quantize_multiplier(code))``, i.e. ``fmt(x * 2^(127 - code))``
            (satfinite, RNE);
        scale_inv: the code as ``torch.float8_e8m0fnu``; ``value = data * 2^(code - 127)``.
    Edge blocks, as TE 2.20 (TE 2.13 on for the cast, ``e8m0_quantize_multiplier``; TE 2.19 on
    for dequantize, whose ``exp2f`` reads code 0 as ``2^-127`` and 255 as NaN, PR #3262):
        tiny: ``amax * float32(1/448) <= 2^-127`` (E4M3: amax up to about 2.6e-36) gives
            code 0, multiplier ``2^127``: the block keeps E4M3's precision (TE <= 2.12
            flushed it to zero); an all-zero or all-NaN block has code 0 too;
        inf: code 254 (``float_to_e8m0`` saturates), multiplier ``2^-127``: inf saturates
            to max and dequantizes to inf (max times ``2^127`` overflows), its finite
            elements to about zero;
        NaN: never in the amax, so a NaN element stays NaN (the format's NaN) and its block is
            scaled as without it; code 255 never arises from a cast.
    """

    recipe = "mxfp8"
    te_name = "MXFP8BlockScaling"
    fp8_format: Format | str = Format.E4M3

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        check_input(x, "MXFP8Quantizer")
        fmt, tile, m = self.element_format, (1, MXFP8_BLOCK), as_matrix(x)
        amax = tile_amax(m, tile)
        rcp = torch.tensor(1.0 / fmt.max, dtype=torch.float32)  # TE's max_norm_rcp, float32
        code = float_to_e8m0(amax * rcp)
        multiplier = expand_tiles(e8m0_quantize_multiplier(code), tile, m.shape)
        return self._result(
            x,
            data=quantize(m, fmt, multiplier).reshape(x.shape),
            scale_inv=code.view(torch.float8_e8m0fnu),
            fmt=fmt.name,
            tile=tile,
            amax=tensor_amax(m),
        )
