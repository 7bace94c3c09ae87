"""Binary floating-point formats: what FP32, TF32, BF16 and FP16 (and later FP8) can represent.

A format with ``e`` exponent bits and ``m`` mantissa bits stores a sign, a biased exponent and
a fraction. A normal number is ``(-1)^s * 1.f * 2^(E - bias)``; exponent field 0 holds the
subnormals ``(-1)^s * 0.f * 2^(1 - bias)``, which fill the gap down to zero in steps of the
smallest subnormal. What the top exponent field means depends on ``nan_encoding``:

    ``"ieee"``  reserved: mantissa 0 is +-inf, anything else NaN (FP32, FP16, BF16, E5M2);
    ``"fn"``    finite numbers, except all-ones exponent *and* mantissa, which is NaN; no inf
                (OCP E4M3, "E4M3FN": max 448 instead of 240);
    ``"fnuz"``  every code finite except "negative zero", which is NaN; no inf, no -0
                (the ``float8_*fnuz`` formats, which also use a bias one larger).

``round_to_format`` rounds float64 values onto any such grid with an explicit algorithm, so the
tests can check it against PyTorch's own casts as an independent reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "FloatFormat",
    "FP32",
    "TF32",
    "FP16",
    "BF16",
    "FORMATS",
    "round_to_format",
    "nonnegative_values",
    "finite_values",
    "format_table",
]

NAN_ENCODINGS = ("ieee", "fn", "fnuz")
MAX_ENUMERABLE_BITS = 16  # nonnegative_values/finite_values list at most 2**16 codes


@dataclass(frozen=True)
class FloatFormat:
    """A sign bit, ``exp_bits`` exponent bits and ``man_bits`` stored mantissa bits.

    Layout:
        name: display name ("BF16"); exp_bits, man_bits: field widths (1 <= man_bits <= 52,
            2 <= exp_bits <= 10, so every value and every rounding step is exact in float64).
        bias: exponent bias; default ``2**(exp_bits - 1) - 1`` as in IEEE 754.
    Special values:
        ieee_special: True reserves the top exponent for inf and NaN (IEEE 754). False keeps it
            for finite numbers; then ``nan_encoding`` says where NaN lives ("fn" by default).
        nan_encoding: "ieee", "fn" or "fnuz" (see the module docstring); None picks "ieee" or
            "fn" from ``ieee_special``.
    Storage:
        torch_dtype: the matching ``torch.dtype``, or None (TF32 is stored as a 32-bit float
            whose low 13 mantissa bits the tensor cores ignore).
    """

    name: str
    exp_bits: int
    man_bits: int
    bias: int | None = None
    ieee_special: bool = True
    torch_dtype: torch.dtype | None = None
    nan_encoding: str | None = None

    def __post_init__(self) -> None:
        if not 2 <= self.exp_bits <= 10 or not 1 <= self.man_bits <= 52:
            raise ValueError(
                f"FloatFormat {self.name!r}: need 2 <= exp_bits <= 10 and 1 <= man_bits <= 52 "
                f"(got {self.exp_bits}, {self.man_bits}); wider formats do not fit in float64."
            )
        if self.bias is None:
            object.__setattr__(self, "bias", 2 ** (self.exp_bits - 1) - 1)
        encoding = self.nan_encoding or ("ieee" if self.ieee_special else "fn")
        if encoding not in NAN_ENCODINGS or (encoding == "ieee") != self.ieee_special:
            raise ValueError(
                f"FloatFormat {self.name!r}: nan_encoding={self.nan_encoding!r} does not fit "
                f"ieee_special={self.ieee_special}; use 'ieee' with ieee_special=True, or 'fn' "
                "or 'fnuz' with ieee_special=False."
            )
        object.__setattr__(self, "nan_encoding", encoding)
        if self.emin - self.man_bits < -1000 or self.emax > 1000:
            raise ValueError(f"FloatFormat {self.name!r}: bias={self.bias} leaves float64 range.")

    # ---- the exponent range ------------------------------------------------------------------
    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal number (also the subnormals' scale)."""
        return 1 - self.bias  # type: ignore[operator]

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest finite number."""
        top = 2**self.exp_bits - 1 - self.bias
        return top - 1 if self.nan_encoding == "ieee" else top

    @property
    def has_inf(self) -> bool:
        return self.nan_encoding == "ieee"

    # ---- headline numbers --------------------------------------------------------------------
    @property
    def total_bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def max(self) -> float:
        """Largest finite value. Under "fn" the all-ones mantissa of the top exponent is NaN."""
        lost = 1 - self.man_bits if self.nan_encoding == "fn" else -self.man_bits
        return (2.0 - 2.0**lost) * 2.0**self.emax

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.man_bits)

    @property
    def eps(self) -> float:
        """Machine epsilon: the gap between 1.0 and the next larger representable number."""
        return 2.0**-self.man_bits

    @property
    def decimal_digits(self) -> float:
        """About how many significant decimal digits the format carries: (m + 1) log10(2)."""
        return (self.man_bits + 1) * math.log10(2.0)

    def spacing(self, x: float) -> float:
        """Gap between the two representable numbers around ``|x|`` (the ulp of its binade).

        At a power of two it is the gap *above* (like ``numpy.spacing``). Below the smallest
        normal the gap is constant, ``min_subnormal``; past ``max`` it is inf; for NaN, NaN.
        """
        a = abs(float(x))
        if math.isnan(a):
            return math.nan
        if a > self.max:
            return math.inf
        binade = math.frexp(a)[1] - 1 if a > 0 else self.emin
        return 2.0 ** (max(binade, self.emin) - self.man_bits)

    def bit_layout(self) -> str:
        return f"1 sign | {self.exp_bits} exponent | {self.man_bits} mantissa"


FP32 = FloatFormat("FP32", exp_bits=8, man_bits=23, torch_dtype=torch.float32)
# TF32 keeps FP32's range and storage; tensor cores round the mantissa to 10 bits.
TF32 = FloatFormat("TF32", exp_bits=8, man_bits=10, torch_dtype=None)
FP16 = FloatFormat("FP16", exp_bits=5, man_bits=10, torch_dtype=torch.float16)
BF16 = FloatFormat("BF16", exp_bits=8, man_bits=7, torch_dtype=torch.bfloat16)

FORMATS: dict[str, FloatFormat] = {"fp32": FP32, "tf32": TF32, "bf16": BF16, "fp16": FP16}


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """Exact ``2.0 ** k`` in float64 for integer k in [-1022, 1023], built from the bits."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64)


def round_to_format(
    x: torch.Tensor | float, fmt: FloatFormat, saturate: bool = False
) -> torch.Tensor:
    """``x`` rounded to the nearest value of ``fmt`` (ties to even), as a float64 tensor.

    Float64 arithmetic, no dtype casts: with binade exponent ``E = max(floor(log2|x|), emin)``
    the grid step is ``q = 2^(E - man_bits)``, and ``|x| / q`` is rounded half-to-even to an
    integer (exact: every step is a multiplication by a power of two). Clamping ``E`` at
    ``emin`` gives the subnormals (gradual underflow) for free.

    Specials: NaN stays NaN, the sign of zero (and of values that round to zero) is kept,
    except under "fnuz", which has no -0. A result above ``max`` overflows: to +-inf for
    IEEE formats, to NaN for formats without inf. ``saturate=True`` returns +-max instead
    (inf included), as FP8 quantizers (Transformer Engine) and torch's e4m3fn cast do.
    """
    t = torch.as_tensor(x).to(torch.float64)
    finite = torch.isfinite(t)
    a = torch.where(finite, t.abs(), 0.0)
    binade = torch.frexp(a).exponent.to(torch.int64) - 1  # a = 1.f * 2^binade
    shift = fmt.man_bits - torch.clamp(binade, min=fmt.emin)
    mag = torch.round(a * _pow2(shift)) * _pow2(-shift)  # torch.round is half-to-even
    over = (mag > fmt.max) | torch.isinf(t)
    if saturate:
        mag = torch.where(over, fmt.max, mag)
    else:
        mag = torch.where(over, math.inf if fmt.has_inf else math.nan, mag)
    out = torch.where(torch.isnan(t), math.nan, torch.copysign(mag, t))
    if fmt.nan_encoding == "fnuz":
        out = torch.where(out == 0, 0.0, out)  # no negative zero in this encoding
    return out


def nonnegative_values(fmt: FloatFormat) -> torch.Tensor:
    """Every finite value of ``fmt`` that is >= 0, sorted, as float64 (zero once; no inf or NaN).

    Only for formats of at most 16 bits (FP16, BF16, FP8), which have at most 65536 codes.
    """
    if fmt.total_bits > MAX_ENUMERABLE_BITS:
        raise ValueError(
            f"Value lists cover formats of at most {MAX_ENUMERABLE_BITS} bits; "
            f"{fmt.name} has {fmt.total_bits} (2**{fmt.total_bits} codes)."
        )
    fraction = torch.arange(2**fmt.man_bits, dtype=torch.float64)  # the integer mantissa
    binades = [fraction * fmt.min_subnormal]  # exponent field 0: zero and the subnormals
    for e in range(fmt.emin, fmt.emax + 1):
        binades.append((2**fmt.man_bits + fraction) * 2.0 ** (e - fmt.man_bits))
    values = torch.cat(binades)
    return values[values <= fmt.max]  # under "fn" the last code of the top binade is NaN


def finite_values(fmt: FloatFormat) -> torch.Tensor:
    """Every finite value of ``fmt``, negatives included, sorted, as float64 (zero once).

    ``nonnegative_values`` mirrored around zero; the same 16-bit limit.
    """
    values = nonnegative_values(fmt)
    return torch.cat([-values[1:].flip(0), values])


def format_table() -> list[dict[str, object]]:
    """One row per format (FP32, TF32, BF16, FP16) for the chapter's comparison table."""
    return [
        {
            "name": fmt.name,
            "layout": fmt.bit_layout(),
            "max": fmt.max,
            "min_normal": fmt.min_normal,
            "min_subnormal": fmt.min_subnormal,
            "eps": fmt.eps,
            "decimal_digits": fmt.decimal_digits,
        }
        for fmt in FORMATS.values()
    ]
