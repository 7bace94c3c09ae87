"""What every quantizer shares: the quantized tensor, tiles, amaxes and TE's scale-from-amax rule.

A quantizer sees its input as a matrix: ``(rows, cols) = (prod(shape[:-1]), shape[-1])`` (a
scalar is 1 x 1), as TE's quantizers flatten the leading dimensions. A *tile* of ``(tr, tc)``
elements shares one scale; the tiles cover that matrix row-major, the last tile of each
dimension padded with zeros (zeros never change an amax, and the padding is cut off again), so
any shape quantizes. The scales form a grid of ``(ceil(rows / tr), ceil(cols / tc))``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from ..formats import E4M3, FP8Format
from ..scaling import FLT_MAX, Format
from .fp4 import E2M1_MAX, decode_e2m1, rht_matrix

__all__ = [
    "ROLES",
    "QuantizedTensor",
    "Quantizer",
    "FP8Quantizer",
    "as_matrix",
    "tile_grid",
    "tile_amax",
    "tensor_amax",
    "expand_tiles",
    "scale_from_amax",
    "resolve_format",
]

ROLES = ("input", "weight", "grad_output")  # the three GEMM operands a recipe quantizes
# NVFP4's decode factor, TE's float32 ``1.0f / (6.0f * 448.0f)``: 1 / (E2M1 max * E4M3 max)
_NVFP4_DECODE = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(E2M1_MAX * E4M3.max)
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A quantizer's result: a low-precision payload and the scales that read it back.

    Payload:
        data: the input's shape. FP8 recipes: a ``torch.float8_e4m3fn`` / ``float8_e5m2``
            tensor. NVFP4: ``torch.uint8`` holding *unpacked* E2M1 codes, one per element in the
            low 4 bits (TE packs two per byte: ``fp4``'s module docstring).
        fmt: the element format, "E4M3", "E5M2" or "E2M1".
    Scales (dequantization multipliers: ``x ~ value(data) * scale_inv`` per tile):
        scale_inv: the tile grid of the input's matrix view (module docstring). Per-tensor: a
            float32 scalar. Rowwise: float32 ``(rows,)``. 1x128 tiles: float32 ``(rows,
            ceil(cols/128))``; 128x128: ``(ceil(rows/128), ceil(cols/128))``. MXFP8: E8M0
            exponents, ``torch.float8_e8m0fnu`` ``(rows, ceil(cols/32))``. NVFP4: E4M3 block
            scales, ``(rows, ceil(cols/16))``, or ``(ceil(rows/16), ceil(cols/16))`` for 16x16.
        tile: ``(tr, tc)``, the elements one scale covers (per-tensor: the whole matrix).
        tensor_scale_inv: NVFP4 only (else None): the float32 second-level multiplier
            ``amax * float32(1/2688)`` (2688 = 6 * 448) that the emulated GEMM applies;
            ``dequantize`` instead forms ``(s_b * amax) * float32(1/2688)`` per tile, as TE's
            kernel does (``quantizers.nvfp4``, overflow included).
        amax: float32 scalar, ``max|x|`` with NaN skipped (TE's ``fmaxf`` reductions), of the
            tensor as quantized (after the Hadamard transform when ``rht``).
    Bookkeeping:
        recipe, role: who made it; dtype: the input's dtype, which ``dequantize`` returns;
        rht: True when ``data`` encodes ``x`` after the 16-point Hadamard transform
        (NVFP4 option); ``dequantize`` undoes it.
    """

    data: torch.Tensor
    scale_inv: torch.Tensor
    fmt: str
    tile: tuple[int, int]
    amax: torch.Tensor
    recipe: str
    role: str
    dtype: torch.dtype
    tensor_scale_inv: torch.Tensor | None = None
    rht: bool = False

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def values(self) -> torch.Tensor:
        """The element values as float32 (FP8 decoded by torch, E2M1 from its codes)."""
        if self.fmt == "E2M1":
            return decode_e2m1(self.data)
        return self.data.to(torch.float32)

    def tile_scales(self) -> torch.Tensor:
        """Each element's ``scale_inv`` in float32, without ``tensor_scale_inv``: a 0-d tensor
        for a single scale, else the ``(rows, cols)`` matrix of its tiles' scales."""
        scale = self.scale_inv.to(torch.float32)
        if scale.numel() == 1:
            return scale.reshape(())
        rows, cols = as_matrix(self.data).shape
        grid = scale.reshape(tile_grid(rows, cols, self.tile))
        return expand_tiles(grid, self.tile, (rows, cols))

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``value(data) * scale_inv`` per tile in float32, cast to ``dtype`` (default: the
        input's dtype). NVFP4: ``value * ((s_b * amax) * float32(1/2688))``, as TE 2.20's
        kernel associates it, so ``s_b * amax`` may overflow to inf (``quantizers.nvfp4``).
        An RHT-encoded tensor is transformed back."""
        q = as_matrix(self.values())
        rows, cols = q.shape
        scale = self.tile_scales()
        if self.tensor_scale_inv is not None:
            scale = (scale * self.amax.to(torch.float32)) * _NVFP4_DECODE.to(scale.device)
        out = q * scale
        if self.rht:
            t = rht_matrix(out.device)
            out = (out.reshape(rows, -1, t.shape[0]) @ t.T).reshape(rows, cols)
        return out.reshape(self.data.shape).to(dtype or self.dtype)

    def __repr__(self) -> str:
        return (
            f"QuantizedTensor({self.recipe}/{self.role}: {self.fmt} data {tuple(self.shape)}, "
            f"scale_inv {tuple(self.scale_inv.shape)} {self.scale_inv.dtype}, tile {self.tile})"
        )


@dataclass(frozen=True, eq=False)
class Quantizer(ABC):
    """A recipe's rule for one GEMM operand. ``quantize(x)`` returns a ``QuantizedTensor``.

    role: "input", "weight" or "grad_output": picks the format (forward or backward) and, for
        block recipes, the tile shape, as TE's recipes do per tensor.
    Subclasses set ``recipe`` (our short name) and ``te_name`` (TE's recipe class).
    """

    recipe: ClassVar[str] = ""
    te_name: ClassVar[str] = ""
    role: str = "input"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(
                f"Unknown role {self.role!r} for the {self.recipe!r} quantizer; use one of "
                f"{', '.join(map(repr, ROLES))}."
            )

    @abstractmethod
    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        """Quantize ``x`` (any shape, a float32 / bfloat16 / float16 / float64 tensor)."""

    def _result(
        self,
        x: torch.Tensor,
        data: torch.Tensor,
        scale_inv: torch.Tensor,
        fmt: str,
        tile: tuple[int, int],
        amax: torch.Tensor,
        tensor_scale_inv: torch.Tensor | None = None,
        rht: bool = False,
    ) -> QuantizedTensor:
        return QuantizedTensor(
            data, scale_inv, fmt, tile, amax, self.recipe, self.role, x.dtype, tensor_scale_inv, rht
        )


@dataclass(frozen=True, eq=False)
class FP8Quantizer(Quantizer):
    """A quantizer with FP8 elements, chosen as TE's recipes do by ``fp8_format``: the forward
    format for input and weight, the backward format for grad_output.

    fp8_format: ``Format.HYBRID`` (E4M3 forward, E5M2 backward) or ``Format.E4M3``, or their
        names; subclasses set TE's default for their recipe.
    """

    fp8_format: Format | str = Format.HYBRID

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "fp8_format", resolve_format(self.fp8_format))

    @property
    def element_format(self) -> FP8Format:
        """E4M3 or E5M2: this role's format under ``fp8_format``."""
        fmt = resolve_format(self.fp8_format)
        return fmt.bwd if self.role == "grad_output" else fmt.fwd


def resolve_format(fp8_format: Format | str) -> Format:
    """A ``Format`` from itself or its name ("hybrid", "e4m3"); E5M2 alone is refused (TE)."""
    fmt = fp8_format
    if isinstance(fmt, str):
        fmt = Format.__members__.get(fmt.upper(), fmt)
    if not isinstance(fmt, Format) or fmt is Format.E5M2:
        raise ValueError(
            f"fp8_format must be Format.HYBRID or Format.E4M3 (or 'hybrid' / 'e4m3'), got "
            f"{fp8_format!r}; pure E5M2 training is not supported, as in Transformer Engine."
        )
    return fmt


# ---- tiles -------------------------------------------------------------------------------------
def check_input(x: torch.Tensor, who: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in _INPUT_DTYPES:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(
            f"{who} quantizes float32, bfloat16, float16 or float64 tensors, got {got}."
        )


def as_matrix(x: torch.Tensor) -> torch.Tensor:
    """The ``(rows, cols)`` view: leading dimensions flattened; a scalar becomes 1 x 1."""
    return x.reshape(1, 1) if x.dim() == 0 else x.reshape(-1, x.shape[-1])


def tile_grid(rows: int, cols: int, tile: tuple[int, int]) -> tuple[int, int]:
    return math.ceil(rows / tile[0]), math.ceil(cols / tile[1])


def _padded(x: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    rows, cols = x.shape
    nr, nc = tile_grid(rows, cols, tile)
    return F.pad(x, (0, nc * tile[1] - cols, 0, nr * tile[0] - rows))


def tile_amax(x: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """``max|x|`` of every tile of the matrix ``x``, NaN skipped, as float32 ``(nr, nc)``.

    NaN is skipped as TE's CUDA reductions do (``fmaxf`` returns the other operand, starting
    from 0), so a NaN element never poisons its tile's scale; inf is kept.
    """
    a = x.to(torch.float32).abs()
    a = _padded(torch.where(torch.isnan(a), 0.0, a), tile)
    nr, nc = tile_grid(x.shape[0], x.shape[1], tile)
    return a.reshape(nr, tile[0], nc, tile[1]).amax(dim=(1, 3))


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """``max|x|`` as a float32 scalar, NaN skipped as in ``tile_amax``; 0 for an empty tensor
    (TE zeroes the amax before its reduction kernel)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    a = x.detach().to(torch.float32).abs()
    return torch.where(torch.isnan(a), 0.0, a).amax()


def expand_tiles(
    grid: torch.Tensor, tile: tuple[int, int], shape: tuple[int, ...] | torch.Size
) -> torch.Tensor:
    """Repeat a ``(nr, nc)`` grid to one value per element of a ``shape`` matrix."""
    full = grid.repeat_interleave(tile[0], dim=0).repeat_interleave(tile[1], dim=1)
    return full[: shape[0], : shape[1]]


# ---- TE's scale from an amax -----------------------------------------------------------------
def scale_from_amax(
    amax: torch.Tensor,
    fp8_max: float,
    *,
    power_2: bool = False,
    epsilon: float = 0.0,
    value_for_inf: float = FLT_MAX,
) -> torch.Tensor:
    """TE's ``compute_scale_from_amax`` (``common/recipe/recipe_common.cuh``), element-wise.

    In order, in float32:
        1. epsilon floor: ``amax < epsilon`` becomes ``epsilon`` (NaN is not < anything);
        2. amax inf, 0 or NaN gives scale 1 (so an all-zero tile keeps scale 1);
        3. ``scale = fp8_max / amax``, a correctly rounded division;
        4. an infinite quotient (a tiny amax) becomes ``value_for_inf``: FLT_MAX for current
           scaling (``current_scaling.cu``), the input dtype's max for block scaling
           (``compute_scale_from_types``);
        5. ``power_2``: the mantissa bits are cleared, rounding the scale *down* to a power of
           two (``2^floor(log2 scale)``), so ``amax * scale`` never exceeds ``fp8_max``.
    TE's Python references differ in step 2 (inf amax gives scale 0 there); the kernels rule.
    """
    a = amax.to(torch.float32)
    a = torch.where(a < epsilon, torch.full_like(a, epsilon), a)
    scale = torch.full_like(a, fp8_max) / a  # tensor / tensor: a true float32 division
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, value_for_inf), scale)
    if power_2:
        bits = scale.view(torch.int32) & torch.tensor(-(1 << 23), dtype=torch.int32)  # 0xFF800000
        scale = bits.view(torch.float32)
    special = torch.isinf(a) | (a == 0) | torch.isnan(a)
    return torch.where(special, torch.ones_like(scale), scale)
