"""Tests for tutorial_lib.fp8.formats against references that share no code with it.

- ``decode``: every one of the 256 codes decoded from its bits in float64, by the OCP rules;
- ``tutorial_lib.formats.round_to_format(..., saturate=True)``: rounding with explicit float64
  arithmetic (no dtype casts), itself tested against torch in tests/test_formats.py;
- the float32 product ``x * scale`` formed as the exact float64 product cast to float32.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_lib.formats import BF16, finite_values, round_to_format
from tutorial_lib.fp8 import E4M3, E5M2, dequantize, quantize
from tutorial_lib.fp8.formats import FP8_FORMATS, FP8Format, get_fp8_format

FORMATS = [E4M3, E5M2]
INF, NAN = math.inf, math.nan
CODES = torch.arange(256, dtype=torch.int32)


def decode(code: int, fmt: FP8Format) -> float:
    """The value of an 8-bit code, from its sign, exponent and mantissa fields (OCP FP8)."""
    sign = -1.0 if code >> 7 else 1.0
    exp = (code >> fmt.man_bits) & ((1 << fmt.exp_bits) - 1)
    man = code & ((1 << fmt.man_bits) - 1)
    top = (1 << fmt.exp_bits) - 1
    if fmt.has_inf and exp == top:  # E5M2: IEEE specials
        return sign * INF if man == 0 else NAN
    if not fmt.has_inf and exp == top and man == (1 << fmt.man_bits) - 1:  # E4M3: S.1111.111
        return NAN
    if exp == 0:
        return sign * man * 2.0 ** (1 - fmt.bias - fmt.man_bits)
    return sign * (1 + man / 2**fmt.man_bits) * 2.0 ** (exp - fmt.bias)


def decoded(fmt: FP8Format) -> torch.Tensor:
    return torch.tensor([decode(c, fmt) for c in range(256)], dtype=torch.float64)


def bits(q: torch.Tensor) -> torch.Tensor:
    return q.view(torch.uint8).to(torch.int32)


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal as float64 bit patterns (so -0 != +0), any NaN matching any NaN."""
    a, e = actual.double(), expected.double()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    differ = (nan_a != nan_e) | ((a.view(torch.int64) != e.view(torch.int64)) & ~nan_a & ~nan_e)
    assert not differ.any(), f"got {a[differ][:5].tolist()}, expected {e[differ][:5].tolist()}"


def reference(x: torch.Tensor, fmt: FP8Format, scale: torch.Tensor | float) -> torch.Tensor:
    """fp8(x * scale): exact float64 product, cast to float32, then rounded with saturation."""
    s = torch.as_tensor(scale, dtype=torch.float32).double()
    product32 = (x.to(torch.float32).double() * s).to(torch.float32)
    return round_to_format(product32.double(), fmt, saturate=True)


# ---- the formats -----------------------------------------------------------------------------
def test_headline_numbers() -> None:
    assert (E4M3.exp_bits, E4M3.man_bits, E4M3.bias) == (4, 3, 7)
    assert (E4M3.max, E4M3.min_normal, E4M3.min_subnormal, E4M3.eps) == (448, 2**-6, 2**-9, 2**-3)
    assert not E4M3.has_inf and E4M3.torch_dtype == torch.float8_e4m3fn
    assert (E5M2.exp_bits, E5M2.man_bits, E5M2.bias) == (5, 2, 15)
    assert (E5M2.max, E5M2.min_normal, E5M2.min_subnormal, E5M2.eps) == (
        57344,
        2**-14,
        2**-16,
        2**-2,
    )
    assert E5M2.has_inf and E5M2.torch_dtype == torch.float8_e5m2
    assert "S.1111.111" in E4M3.specials and "no inf" in E4M3.specials
    assert "inf = S.11111.00" in E5M2.specials
    for fmt in FORMATS:  # the headline numbers agree with torch's own description
        info = torch.finfo(fmt.torch_dtype)
        assert (info.max, info.tiny, info.eps) == (fmt.max, fmt.min_normal, fmt.eps)


def test_lookup_and_validation() -> None:
    assert get_fp8_format("E4M3") is E4M3 and get_fp8_format(torch.float8_e5m2) is E5M2
    assert FP8_FORMATS == {"e4m3": E4M3, "e5m2": E5M2}
    with pytest.raises(ValueError, match="Unknown FP8 format"):
        get_fp8_format(BF16)
    with pytest.raises(ValueError, match="8 bits"):
        FP8Format("E4M4", exp_bits=4, man_bits=4, torch_dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_torch_decodes_every_code_as_we_do(fmt: FP8Format) -> None:
    from_torch = CODES.to(torch.uint8).view(fmt.torch_dtype).double()
    assert_same(from_torch, decoded(fmt))
    nan_codes = {c for c in range(256) if math.isnan(decode(c, fmt))}
    expected = {0x7F, 0xFF} if fmt is E4M3 else {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}
    assert nan_codes == expected


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_quantize_reproduces_every_code(fmt: FP8Format) -> None:
    values = decoded(fmt)
    got = quantize(values.float(), fmt, torch.tensor(1.0))
    assert got.dtype == fmt.torch_dtype
    nan, inf = torch.isnan(values), torch.isinf(values)
    assert torch.equal(bits(got)[~nan & ~inf], CODES[~nan & ~inf])  # -0 included
    assert torch.isnan(got.float()[nan]).all()
    max_code = int(CODES[values == fmt.max])
    assert bits(got)[inf].tolist() == [max_code, max_code | 0x80][: int(inf.sum())]  # saturate


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_finite_values(fmt: FP8Format) -> None:
    values = decoded(fmt)
    finite = sorted({v for v in values.tolist() if math.isfinite(v)})  # -0 == 0 merges
    assert finite_values(fmt).tolist() == finite
    assert len(finite) == (253 if fmt is E4M3 else 247)


# ---- rounding ----------------------------------------------------------------------------------
def special_inputs(fmt: FP8Format) -> torch.Tensor:
    m, sub = fmt.max, fmt.min_subnormal
    ulp_top = fmt.spacing(m)
    vals = [0.0, -0.0, INF, -INF, NAN, m, -m, m + ulp_top / 2, m + ulp_top, 2 * m, 1e30]
    vals += [sub, sub / 2, sub * 0.75, sub * 1.5, sub * 2.5, fmt.min_normal * (1 - 2**-12)]
    vals += [480.0, 500.0, 464.0, 61440.0, 70000.0, -70000.0, 3.4e38]
    return torch.tensor(vals + [-v for v in vals], dtype=torch.float32)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_specials_saturate_and_keep_nan(fmt: FP8Format) -> None:
    x = special_inputs(fmt)
    assert_same(quantize(x, fmt, 1.0).double(), reference(x, fmt, 1.0))
    q = quantize(torch.tensor([INF, -INF, 1e30, NAN]), fmt, 1.0).double()
    assert q[:3].tolist() == [fmt.max, -fmt.max, fmt.max] and math.isnan(q[3])
    assert torch.isnan(torch.clamp(torch.tensor(NAN), -1.0, 1.0))  # what quantize relies on


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_ties_round_to_even(fmt: FP8Format) -> None:
    v = finite_values(fmt)
    mids = ((v[1:] + v[:-1]) / 2).float()  # exact in float32: FP8 values have few bits
    assert torch.equal(mids.double(), (v[1:] + v[:-1]) / 2)
    got = quantize(mids, fmt, 1.0)
    assert_same(got.double(), reference(mids, fmt, 1.0))
    assert (bits(got) & 1 == 0).all()  # the even neighbour (its code's last bit is 0)
    above = (v[1:] + v[:-1]) / 2 * (1 + 2**-20)  # just past each midpoint: the upper neighbour
    up = quantize(above.float().abs(), fmt, 1.0).double()
    assert torch.equal(up, v[1:].abs().maximum(v[:-1].abs()))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_random_values_match_reference(fmt: FP8Format) -> None:
    g = torch.Generator().manual_seed(0)
    mag = torch.exp2(torch.empty(20_000, dtype=torch.float64).uniform_(-26, 20, generator=g))
    x = (mag * torch.randn(20_000, generator=g, dtype=torch.float64).sign()).float()
    x = torch.cat([x, special_inputs(fmt)])
    for scale in (1.0, 3.0, 0.1, 2.0**-7, 1e4):
        s = torch.tensor(scale, dtype=torch.float32)
        assert_same(quantize(x, fmt, s).double(), reference(x, fmt, s))


@settings(max_examples=150, deadline=None)
@given(
    x=st.lists(st.floats(width=32), min_size=1, max_size=16),
    scale=st.floats(min_value=2.0**-30, max_value=2.0**30, width=32),
    name=st.sampled_from(["e4m3", "e5m2"]),
)
def test_hypothesis_matches_reference(x: list[float], scale: float, name: str) -> None:
    fmt = FP8_FORMATS[name]
    xt = torch.tensor(x, dtype=torch.float32)
    assert_same(quantize(xt, fmt, torch.tensor(scale)).double(), reference(xt, fmt, scale))


# ---- the scale -----------------------------------------------------------------------------------
def test_product_is_rounded_to_float32_first() -> None:
    """x * scale is one float32 multiplication (as in TE's kernels), then the FP8 rounding.

    Here the exact product 1.0625 + 2^-27 - 2^-46 lies just above the E4M3 midpoint between 1
    and 1.125, but rounds to the midpoint itself in float32, which then ties to even (1.0).
    """
    x = torch.tensor([1 + 2.0**-23])
    s = torch.tensor(1.0625 - 2.0**-23)
    exact = x.double() * s.double()
    assert exact.item() > 1.0625 and (x * s).item() == 1.0625
    assert round_to_format(exact, E4M3, saturate=True).item() == 1.125  # float64 would round up
    assert quantize(x, E4M3, s).float().item() == 1.0


def test_scale_broadcasts_and_inputs_convert() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, generator=g) * 100
    scale = torch.tensor([[0.5], [2.0], [7.0]])
    q = quantize(x, E4M3, scale)
    for i in range(3):
        assert torch.equal(bits(q[i]), bits(quantize(x[i], E4M3, scale[i, 0])))
    xb = x.bfloat16()  # a bf16 input is widened exactly, then scaled in float32
    assert torch.equal(bits(quantize(xb, E5M2, 3.0)), bits(quantize(xb.float(), E5M2, 3.0)))


# ---- dequantize ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_dequantize_round_trip(fmt: FP8Format) -> None:
    values = decoded(fmt)
    finite = torch.isfinite(values)
    q = CODES[finite].to(torch.uint8).view(fmt.torch_dtype)
    scale = torch.tensor(2.0**10)  # a power of two: every step is exact
    x = dequantize(q, torch.tensor(2.0**-10))
    assert x.dtype == torch.float32
    assert torch.equal(x.double(), values[finite] * 2.0**-10)
    assert torch.equal(bits(quantize(x, fmt, scale)), CODES[finite])
    assert dequantize(q, 1.0, dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_dequantize_error_within_half_ulp(fmt: FP8Format) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5000, generator=g) * 10
    scale = torch.tensor(fmt.max) / x.abs().max()  # the amax maps onto max, as a recipe would
    y = dequantize(quantize(x, fmt, scale), torch.ones(()) / scale)
    normal = (x * scale).abs() >= fmt.min_normal
    rel = ((y - x).abs() / x.abs())[normal]
    assert rel.max() <= fmt.eps / 2 * (1 + 1e-5)


def test_dequantize_rejects_non_fp8() -> None:
    with pytest.raises(TypeError, match="float8"):
        dequantize(torch.ones(3), 1.0)
