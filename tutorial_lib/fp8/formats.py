"""The two FP8 formats of Hopper tensor cores, and per-tensor scaled quantization into them.

OCP FP8 (the formats of ``torch.float8_e4m3fn`` and ``torch.float8_e5m2``):

    E4M3  1 sign | 4 exponent | 3 mantissa, bias 7.  No inf; only S.1111.111 is NaN, so the
          top binade stays finite and the largest value is 448 (not 240 as IEEE rules would
          give). Used for activations and weights: more precision, less range.
    E5M2  1 sign | 5 exponent | 2 mantissa, bias 15. IEEE-like: S.11111.00 is inf, any other
          mantissa under the all-ones exponent is NaN; largest value 57344. Used for gradients:
          more range, less precision.

A tensor is stored as ``q = fp8(x * scale)`` with a float32 per-tensor ``scale`` and read back as
``q * scale_inv``. How the scale is chosen is the recipe's business (``tutorial_lib.fp8.scaling``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import FloatFormat

__all__ = [
    "FP8Format",
    "E4M3",
    "E5M2",
    "FP8_FORMATS",
    "get_fp8_format",
    "quantize",
    "dequantize",
]

_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class FP8Format(FloatFormat):
    """A ``FloatFormat`` of 8 bits stored in a torch float8 dtype.

    Fields, headline numbers (``max``, ``min_normal``, ``min_subnormal``, ``eps``, ``bias``) and
    the special-value rules (``nan_encoding``, ``has_inf``) are inherited from ``FloatFormat``.
    Added here:
        specials: one line saying which bit patterns are inf and NaN (S = sign bit).
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.total_bits != 8 or self.torch_dtype not in _FP8_DTYPES:
            raise ValueError(
                f"FP8Format {self.name!r}: need 8 bits and a torch float8 dtype "
                f"({', '.join(map(str, _FP8_DTYPES))}); got {self.total_bits} bits, "
                f"{self.torch_dtype}."
            )

    @property
    def specials(self) -> str:
        """Where inf and NaN live, as bit patterns ``S.exponent.mantissa``."""
        top = "1" * self.exp_bits
        if self.has_inf:
            return (
                f"inf = S.{top}.{'0' * self.man_bits}; NaN = S.{top}.(any non-zero mantissa); "
                f"max = {self.max:g}"
            )
        return (
            f"no inf; NaN = S.{top}.{'1' * self.man_bits} only; the rest of the top binade is "
            f"finite, max = {self.max:g}"
        )


E4M3 = FP8Format(
    "E4M3", exp_bits=4, man_bits=3, ieee_special=False, torch_dtype=torch.float8_e4m3fn
)
E5M2 = FP8Format("E5M2", exp_bits=5, man_bits=2, torch_dtype=torch.float8_e5m2)

FP8_FORMATS: dict[str, FP8Format] = {"e4m3": E4M3, "e5m2": E5M2}


def get_fp8_format(fmt: str | torch.dtype | FloatFormat) -> FP8Format:
    """An ``FP8Format`` from itself, its name ("e4m3", case-insensitive) or its torch dtype."""
    if isinstance(fmt, FP8Format):
        return fmt
    for candidate in FP8_FORMATS.values():
        if fmt == candidate.torch_dtype or (
            isinstance(fmt, str) and fmt.lower() == candidate.name.lower()
        ):
            return candidate
    if isinstance(fmt, FloatFormat) and fmt.torch_dtype in _FP8_DTYPES:
        return get_fp8_format(fmt.torch_dtype)
    raise ValueError(
        f"Unknown FP8 format {fmt!r}. Use E4M3 or E5M2 (names 'e4m3', 'e5m2', or "
        "torch.float8_e4m3fn, torch.float8_e5m2)."
    )


# ---- quantization ----------------------------------------------------------------------------
def quantize(
    x: torch.Tensor, fmt: FloatFormat | str | torch.dtype, scale: torch.Tensor | float
) -> torch.Tensor:
    """``fp8(x * scale)``: the FP8 tensor (dtype ``fmt.torch_dtype``) that stores ``x``.

    Arithmetic, as in Transformer Engine's cast kernels:
        ``x`` and ``scale`` are converted to float32 first (a float64 input is thus rounded
        twice); ``x * scale`` is one float32 multiplication (``scale`` a scalar or broadcastable
        tensor), rounded to the format with round-to-nearest-even.
    Special values (TE's saturating ``satfinite`` conversion):
        results beyond the finite range, inf included, become +-max; NaN stays NaN; the sign
        of zero is kept.
    The clamp to +-max happens before the cast because torch's own casts differ: E5M2 overflows
    to inf (70000 -> inf), and before pytorch/pytorch#178817 (April 2026) the E4M3 cast turned
    values above 464 into NaN (464 itself rounds to even, down to 448).
    ``torch.clamp`` passes NaN through unchanged.
    """
    fp8 = get_fp8_format(fmt)
    y = x.to(torch.float32) * torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    return torch.clamp(y, -fp8.max, fp8.max).to(fp8.torch_dtype)


def dequantize(
    q: torch.Tensor, scale_inv: torch.Tensor | float, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``q * scale_inv`` computed in float32 (then cast to ``dtype``); ``q`` an FP8 tensor."""
    if q.dtype not in _FP8_DTYPES:
        raise TypeError(f"dequantize expects a float8 tensor, got {q.dtype}.")
    out = q.to(torch.float32) * torch.as_tensor(scale_inv, dtype=torch.float32, device=q.device)
    return out.to(dtype)
