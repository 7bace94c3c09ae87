"""One scale per tensor (delayed and current scaling) or per row (torchao's rowwise recipe).

All three write ``fp8(x * scale)`` with ``tutorial_lib.fp8.quantize`` (float32 product,
round-to-nearest-even, saturating: inf becomes +-max, NaN stays NaN) and keep
``scale_inv = 1 / scale`` (float32 reciprocal) to read it back. They differ in where the scale
comes from:

    delayed   given: the module's amax history made it (``scaling.update_amax_and_scale``)
    current   this tensor's amax, TE's ``Float8CurrentScaling``
    rowwise   each row's amax, torchao's ``rowwise`` recipe for ``torch._scaled_mm`` on Hopper

Any shape quantizes, empty tensors included. TE's GEMMs additionally need the flattened
leading dimensions divisible by 8 and the last by 16; ``torch._scaled_mm`` needs 16 as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import E4M3, quantize
from ..scaling import FLT_MAX, Format
from .base import (
    FP8Quantizer,
    QuantizedTensor,
    Quantizer,
    as_matrix,
    check_input,
    scale_from_amax,
    tensor_amax,
)

__all__ = ["DelayedQuantizer", "CurrentQuantizer", "RowwiseQuantizer", "TORCHAO_EPS"]

TORCHAO_EPS = 1e-12  # torchao's floor on an amax before dividing (``float8_utils.EPS``)


@dataclass(frozen=True, eq=False)
class _PerTensor(FP8Quantizer):
    """Shared by delayed and current scaling: one scale, TE's HYBRID default."""

    fp8_format: Format | str = Format.HYBRID  # E4M3 forward, E5M2 for grad_output (TE default)

    def _quantize_with(self, x: torch.Tensor, scale: torch.Tensor) -> QuantizedTensor:
        fmt = self.element_format
        m = as_matrix(x)
        return self._result(
            x,
            data=quantize(x, fmt, scale),
            scale_inv=torch.reciprocal(scale),
            fmt=fmt.name,
            tile=(max(m.shape[0], 1), max(m.shape[1], 1)),
            amax=tensor_amax(x),
        )


@dataclass(frozen=True, eq=False)
class DelayedQuantizer(_PerTensor):
    """TE's ``DelayedScaling`` cast: ``fp8(x * scale)`` with a scale chosen *before* the tensor
    was seen. The amax history and the update rule live in the module's state
    (``tutorial_lib.fp8.scaling``); this quantizer only applies a given scale.

    Fields:
        scale: float or 1-element tensor, default 1 (TE's initial scale); used as float32.
        fp8_format: ``Format.HYBRID`` (default) or ``Format.E4M3``, as ``DelayedScaling``.
    Result: ``data`` equals ``tutorial_lib.fp8.quantize(x, fmt, scale)`` bit for bit,
    ``scale_inv = 1 / scale`` (TE stores the reciprocal), and ``amax`` is what TE records into
    history row 0 (the unscaled tensor's ``max|x|``, NaN skipped). A scale of 0 gives
    ``scale_inv = inf``; TE keeps such scales as they are, and so does this.
    """

    recipe = "delayed"
    te_name = "DelayedScaling"
    scale: float | torch.Tensor = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.scale, torch.Tensor) and self.scale.numel() != 1:
            raise ValueError(
                f"DelayedQuantizer.scale must be one number, got shape {tuple(self.scale.shape)}."
            )

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        check_input(x, "DelayedQuantizer")
        scale = torch.as_tensor(self.scale, dtype=torch.float32, device=x.device)
        return self._quantize_with(x, scale.reshape(()))


@dataclass(frozen=True, eq=False)
class CurrentQuantizer(_PerTensor):
    """TE's ``Float8CurrentScaling``: the scale comes from this tensor's own amax.

    Fields (TE's ``QParams`` and defaults; the environment variable
    ``NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES`` is not read):
        fp8_format: ``Format.HYBRID`` (default: E4M3 input/weight, E5M2 grad_output) or E4M3.
        power_2_scale: False (default); True rounds the scale down to a power of two.
        amax_epsilon: 0.0 (default); a floor on the amax before dividing.
    Scale: ``scale_from_amax(amax, fmt.max, ...)`` with FLT_MAX for an infinite quotient
    (TE's ``nvte_compute_scale_from_amax``): ``fmt.max / amax`` in float32; amax 0 (an all-zero
    tensor), inf or NaN gives scale 1. The amax skips NaN (TE's amax kernel reduces with
    ``fmaxf``), so NaN elements stay NaN without changing the others' scale; an inf element
    makes the scale 1, so inf saturates to max and the rest quantize unscaled.
    Without power_2 the result equals ``quantize(x, fmt, fmt.max / amax)`` bit for bit.
    """

    recipe = "current"
    te_name = "Float8CurrentScaling"
    power_2_scale: bool = False
    amax_epsilon: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.amax_epsilon >= 0.0:
            raise ValueError(f"amax_epsilon must be >= 0, got {self.amax_epsilon!r}.")

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        check_input(x, "CurrentQuantizer")
        amax = tensor_amax(x)
        scale = scale_from_amax(
            amax,
            self.element_format.max,
            power_2=self.power_2_scale,
            epsilon=self.amax_epsilon,
            value_for_inf=FLT_MAX,
        )
        return self._quantize_with(x, scale)


@dataclass(frozen=True, eq=False)
class RowwiseQuantizer(Quantizer):
    """torchao's ``rowwise`` float8 recipe: one scale per row, E4M3 for every operand.

    Rows are those of the matrix view (leading dimensions flattened); a row is one GEMM
    operand's reduction vector, as ``torch._scaled_mm``'s rowwise scales expect (an ``(M, 1)``
    scale for ``A``, ``(1, N)`` for ``B``); the column-wise copy a backward GEMM needs is
    ``quantize(x.T)``. Rules, as torchao's ``amax_to_scale`` (``torchao/float8/float8_utils.py``):
        amax: ``max|row|``, NaN *propagating* (``torch.amax``);
        scale: ``448 / max(amax, 1e-12)`` computed in float64, then rounded to float32;
        power_2_scale (default True, the recipe's ``round_scales_to_power_of_2``): rounded down,
            ``2^floor(log2 scale)``.
    So an all-zero row gets a huge but finite scale (448e12, rounded to a power of two), and a
    row holding inf or NaN dequantizes to NaN (torchao has no special case; a row's non-finite
    amax gives scale 0 or NaN). ``scale_inv`` is ``1 / scale``, float32 ``(rows,)``.
    """

    recipe = "rowwise"
    te_name = ""  # not a TE recipe
    power_2_scale: bool = True

    def quantize(self, x: torch.Tensor) -> QuantizedTensor:
        check_input(x, "RowwiseQuantizer")
        m = as_matrix(x)
        amax = m.to(torch.float32).abs().amax(dim=1) if m.shape[1] else m.new_zeros(m.shape[0])
        amax = amax.to(torch.float32)
        scale = (E4M3.max / amax.to(torch.float64).clamp(min=TORCHAO_EPS)).to(torch.float32)
        if self.power_2_scale:
            scale = torch.exp2(torch.floor(torch.log2(scale)))
        data = quantize(m, E4M3, scale[:, None]).reshape(x.shape)
        return self._result(
            x,
            data=data,
            scale_inv=torch.reciprocal(scale),
            fmt=E4M3.name,
            tile=(1, max(m.shape[1], 1)),
            amax=tensor_amax(x),
        )
