"""Tests for tutorial_lib.formats, against references that share no code with it.

- FP16, BF16, FP8: PyTorch's own dtype casts (float32 inputs, so each cast rounds once);
- FP32: torch's float64 -> float32 cast;
- TF32: rounding the float32 bit pattern to 10 mantissa bits with integer arithmetic;
- any small format: brute force over ``nonnegative_values`` (nearest value, ties to the even
  code), itself checked against the codes of the torch dtypes.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_lib.formats import (
    BF16,
    FORMATS,
    FP16,
    FP32,
    TF32,
    FloatFormat,
    finite_values,
    format_table,
    nonnegative_values,
    round_to_format,
)

E4M3 = FloatFormat("E4M3", exp_bits=4, man_bits=3, ieee_special=False)  # OCP "E4M3FN"
E5M2 = FloatFormat("E5M2", exp_bits=5, man_bits=2)
E4M3FNUZ = FloatFormat("E4M3FNUZ", 4, 3, bias=8, ieee_special=False, nan_encoding="fnuz")
E5M2FNUZ = FloatFormat("E5M2FNUZ", 5, 2, bias=16, ieee_special=False, nan_encoding="fnuz")
INF, NAN = math.inf, math.nan


def assert_same(actual: torch.Tensor, expected: torch.Tensor, inputs: torch.Tensor) -> None:
    """Equal as float64 bit patterns (so -0 != +0), with any NaN matching any NaN."""
    actual, expected = actual.double(), expected.double()
    assert actual.shape == expected.shape
    nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
    bits_differ = actual.view(torch.int64) != expected.view(torch.int64)
    bad = (nan_a != nan_e) | (bits_differ & ~nan_a & ~nan_e)
    if bad.any():
        i = bad.nonzero().flatten()[:5]
        raise AssertionError(
            f"{int(bad.sum())} mismatches, e.g. inputs {inputs.flatten()[i].tolist()}: "
            f"got {actual[i].tolist()}, expected {expected[i].tolist()}"
        )


def all_codes(dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of a 16- or 8-bit dtype, as float32 (exact)."""
    bits = 16 if dtype in (torch.float16, torch.bfloat16) else 8
    codes = torch.arange(2**bits, dtype=torch.int32)
    if bits == 16:
        return codes.to(torch.int16).view(dtype).float()
    return codes.to(torch.uint8).view(dtype).float()


def grid_and_ties(dtype: torch.dtype) -> torch.Tensor:
    """All values of ``dtype``, the midpoints between neighbours (including the one just above
    max) and the float32 numbers right next to each midpoint; all exact in float32."""
    values = all_codes(dtype)
    finite = torch.unique(values[torch.isfinite(values)].double())  # sorted, one zero
    top = finite[-1] + (finite[-1] - finite[-2])  # the next grid point past max
    ext = torch.cat([-top[None], finite, top[None]])
    mids = ((ext[:-1] + ext[1:]) / 2).float()
    assert torch.equal(mids.double(), (ext[:-1] + ext[1:]) / 2)  # exact in float32
    near = torch.cat([torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)])
    return torch.cat([values, mids, near, torch.tensor([-0.0, INF, -INF, NAN])])


def random_float32(n: int, seed: int = 0) -> torch.Tensor:
    """Random bit patterns: every exponent (subnormals, inf, NaN) equally likely, plus specials."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    specials = [0.0, -0.0, INF, -INF, NAN, 65504.0, 65519.99, 65520.0, 70000.0, -1e38, 3.4e38]
    return torch.cat([bits.view(torch.float32), torch.tensor(specials)])


# ---- FP16 and BF16 against torch casts ------------------------------------------------------


@pytest.mark.parametrize("fmt", [FP16, BF16], ids=["fp16", "bf16"])
def test_grid_and_ties_match_torch(fmt: FloatFormat) -> None:
    x = grid_and_ties(fmt.torch_dtype)  # type: ignore[arg-type]
    assert_same(round_to_format(x, fmt), x.to(fmt.torch_dtype).double(), x)


@pytest.mark.parametrize("fmt", [FP16, BF16], ids=["fp16", "bf16"])
def test_random_float32_match_torch(fmt: FloatFormat) -> None:
    x = random_float32(200_000)
    assert_same(round_to_format(x, fmt), x.to(fmt.torch_dtype).double(), x)


def test_fp16_overflow_boundary_and_underflow() -> None:
    x = torch.tensor([65504.0, 65519.0, 65520.0, -65520.0, 1e5, 2.0**-24, 2.0**-25, -(2.0**-26)])
    out = round_to_format(x, FP16).tolist()
    assert out[:5] == [65504.0, 65504.0, INF, -INF, INF]  # 65520 is the tie: to even -> inf
    assert out[5:7] == [2.0**-24, 0.0]  # the tie at half the smallest subnormal goes to 0
    assert math.copysign(1.0, out[7]) == -1.0 and out[7] == 0.0  # signed zero kept


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=True, allow_infinity=True))
def test_any_float32_matches_torch_fp16(value: float) -> None:
    x = torch.tensor([value], dtype=torch.float32)
    assert_same(round_to_format(x, FP16), x.half().double(), x)


# ---- FP32 and TF32 --------------------------------------------------------------------------


def test_fp32_is_identity_on_float32() -> None:
    x = random_float32(100_000, seed=1)
    assert_same(round_to_format(x, FP32), x.double(), x)


def test_fp32_rounds_float64_like_torch() -> None:
    g = torch.Generator().manual_seed(2)
    n = 100_000
    exponent = torch.randint(-160, 131, (n,), generator=g)  # FP32 subnormals to past overflow
    mantissa = torch.randint(0, 2**52, (n,), generator=g)
    sign = torch.randint(0, 2, (n,), generator=g)
    x = ((sign << 63) | ((exponent + 1023) << 52) | mantissa).view(torch.float64)
    lo = torch.randn(10_000, generator=g).float()
    ties = (lo.double() + torch.nextafter(lo, lo * 2).double()) / 2  # exact FP32 midpoints
    x = torch.cat([x, ties, torch.tensor([3.4028235677973366e38, 1e-46, -1e-300, NAN])])
    assert_same(round_to_format(x, FP32), x.float().double(), x)


def tf32_by_bits(x: torch.Tensor) -> torch.Tensor:
    """Round float32 to 10 mantissa bits (RNE) on the bit pattern; inf/NaN pass through."""
    bits = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF & 0xFFFFFFFF
    rounded = torch.where(rounded >= 2**31, rounded - 2**32, rounded)  # back to signed int32
    out = rounded.to(torch.int32).view(torch.float32)
    return torch.where(torch.isfinite(x), out, x)


def test_tf32_matches_bit_rounding() -> None:
    x = random_float32(200_000, seed=3)
    edge = torch.tensor([3.4e38, 3.4011621e38, 3.4019e38, -3.4028e38, 1e-41, 1 + 2.0**-11])
    x = torch.cat([x, edge, torch.nextafter(edge, edge * 2)])
    assert_same(round_to_format(x, TF32), tf32_by_bits(x).double(), x)


# ---- FP8 against torch's float8 casts -------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "dtype"),
    [
        (E4M3, torch.float8_e4m3fn),
        (E5M2, torch.float8_e5m2),
        (E4M3FNUZ, torch.float8_e4m3fnuz),
        (E5M2FNUZ, torch.float8_e5m2fnuz),
    ],
    ids=["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"],
)
def test_fp8_values_match_torch_codes(fmt: FloatFormat, dtype: torch.dtype) -> None:
    codes = all_codes(dtype).double()
    expected = torch.unique(codes[torch.isfinite(codes)])
    assert torch.equal(finite_values(fmt), expected)
    assert fmt.max == expected.max().item()


def test_e4m3fn_matches_torch_in_range_and_saturating() -> None:
    assert (E4M3.max, E4M3.min_normal, E4M3.min_subnormal) == (448.0, 2.0**-6, 2.0**-9)
    x = torch.cat([grid_and_ties(torch.float8_e4m3fn), random_float32(100_000, seed=4)])
    expected = x.to(torch.float8_e4m3fn).double()
    in_range = ~(x.abs() > 464.0)  # 464 is the tie between 448 and the NaN code (480)
    assert_same(round_to_format(x, E4M3)[in_range], expected[in_range], x[in_range])
    # torch 2.13 saturates e4m3fn casts (REFERENCE.md): the same as saturate=True everywhere.
    assert_same(round_to_format(x, E4M3, saturate=True), expected, x)
    beyond = round_to_format(torch.tensor([465.0, -1e9, INF]), E4M3)
    assert torch.isnan(beyond).all()  # no inf in E4M3: a non-saturating overflow is NaN


@pytest.mark.parametrize(
    ("fmt", "dtype"),
    [
        (E5M2, torch.float8_e5m2),
        (E4M3FNUZ, torch.float8_e4m3fnuz),
        (E5M2FNUZ, torch.float8_e5m2fnuz),
    ],
    ids=["e5m2", "e4m3fnuz", "e5m2fnuz"],
)
def test_non_saturating_fp8_matches_torch(fmt: FloatFormat, dtype: torch.dtype) -> None:
    """torch does not saturate these: E5M2 overflows to inf (70000 -> inf), fnuz to NaN."""
    x = torch.cat([grid_and_ties(dtype), random_float32(100_000, seed=5)])
    assert_same(round_to_format(x, fmt), x.to(dtype).double(), x)


def test_saturate_clamps_and_keeps_nan() -> None:
    x = torch.tensor([70000.0, -INF, INF, NAN, 1.0, 57344.0])
    out = round_to_format(x, E5M2, saturate=True)
    assert out[:3].tolist() == [57344.0, -57344.0, 57344.0]
    assert torch.isnan(out[3]) and out[4:].tolist() == [1.0, 57344.0]


# ---- any small format against brute force ---------------------------------------------------


def brute_force(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Nearest value of ``nonnegative_values`` (ties: even code index); past max: overflow."""
    values = nonnegative_values(fmt)
    top = values[-1] + 2.0 ** (fmt.emax - fmt.man_bits)  # the first code past max
    grid = torch.cat([values, top[None]])
    a = x.abs()
    hi = torch.searchsorted(grid, a).clamp(1, len(grid) - 1)
    lo = hi - 1
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    pick = torch.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    pick = torch.where(a >= top, len(grid) - 1, pick)
    mag = torch.where(pick == len(grid) - 1, INF if fmt.has_inf else NAN, grid[pick])
    out = torch.copysign(mag, x)
    return torch.where(out == 0, 0.0, out) if fmt.nan_encoding == "fnuz" else out


@pytest.mark.parametrize("exp_bits", [2, 3, 5, 6])
@pytest.mark.parametrize("man_bits", [1, 2, 4, 9])
@pytest.mark.parametrize("encoding", ["ieee", "fn", "fnuz"])
def test_small_formats_match_brute_force(exp_bits: int, man_bits: int, encoding: str) -> None:
    fmt = FloatFormat(
        "x", exp_bits, man_bits, ieee_special=encoding == "ieee", nan_encoding=encoding
    )
    values = nonnegative_values(fmt)
    top = values[-1] + 2.0 ** (fmt.emax - fmt.man_bits)
    ext = torch.cat([values, top[None]])
    mids = (ext[:-1] + ext[1:]) / 2
    g = torch.Generator().manual_seed(exp_bits * 100 + man_bits)
    logs = torch.empty(20_000, dtype=torch.float64).uniform_(
        math.log(fmt.min_subnormal / 4), math.log(fmt.max * 4), generator=g
    )
    x = torch.cat(
        [
            values,
            mids,
            torch.nextafter(mids, mids * 2),
            torch.nextafter(mids, -mids),
            logs.exp(),
            2 * top[None],
        ]
    )
    x = torch.cat([x, -x])
    assert_same(round_to_format(x, fmt), brute_force(x, fmt), x)


# ---- properties, table, errors --------------------------------------------------------------


def test_known_constants() -> None:
    assert (FP16.max, FP16.min_normal, FP16.min_subnormal, FP16.eps) == (
        65504.0,
        2.0**-14,
        2.0**-24,
        2.0**-10,
    )
    assert BF16.max == pytest.approx(3.3895e38, rel=1e-4) and BF16.eps == 2.0**-7
    assert BF16.max == torch.finfo(torch.bfloat16).max
    assert FP32.max == pytest.approx(3.4028e38, rel=1e-4) and FP32.max == torch.finfo().max
    assert (FP32.min_normal, FP32.min_subnormal) == (2.0**-126, 2.0**-149)
    assert (TF32.eps, TF32.max, TF32.min_normal) == (2.0**-10, (2 - 2**-10) * 2.0**127, 2.0**-126)
    for fmt in (FP32, FP16, BF16):
        info = torch.finfo(fmt.torch_dtype)
        assert (fmt.eps, fmt.min_normal, fmt.min_subnormal) == (
            info.eps,
            info.tiny,
            info.smallest_normal * 2.0**-fmt.man_bits,
        )
    assert [f.total_bits for f in (FP32, TF32, FP16, BF16)] == [32, 19, 16, 16]
    assert BF16.bit_layout() == "1 sign | 8 exponent | 7 mantissa"
    assert FP16.decimal_digits == pytest.approx(3.31, abs=0.01)
    assert BF16.decimal_digits == pytest.approx(2.41, abs=0.01)
    assert FP32.decimal_digits == pytest.approx(7.22, abs=0.01)


def test_spacing() -> None:
    assert FP16.spacing(1.0) == 2.0**-10 and FP16.spacing(-1.0) == 2.0**-10
    assert FP16.spacing(0.99) == 2.0**-11 and FP16.spacing(65504.0) == 32.0
    assert FP16.spacing(1e-6) == FP16.spacing(0.0) == 2.0**-24  # subnormal: constant gap
    assert FP16.spacing(7e4) == INF and math.isnan(FP16.spacing(NAN))
    assert BF16.spacing(256.0) == 2.0 and FP32.spacing(1.0) == 2.0**-23
    values = nonnegative_values(FP16)
    gaps = values[1:] - values[:-1]
    assert [FP16.spacing(v) for v in values[:-1].tolist()] == gaps.tolist()


def test_nonnegative_and_finite_values() -> None:
    fp16 = nonnegative_values(FP16)
    assert len(fp16) == 31744 and fp16[0] == 0 and fp16[-1] == 65504.0
    assert torch.all(fp16[1:] > fp16[:-1])
    both = finite_values(BF16)
    codes = all_codes(torch.bfloat16).double()
    assert torch.equal(both, torch.unique(codes[torch.isfinite(codes)]))
    with pytest.raises(ValueError, match="at most 16 bits; TF32 has 19"):
        nonnegative_values(TF32)


def test_format_table_rows() -> None:
    rows = format_table()
    assert [r["name"] for r in rows] == ["FP32", "TF32", "BF16", "FP16"]
    keys = {"name", "layout", "max", "min_normal", "min_subnormal", "eps", "decimal_digits"}
    assert all(set(r) == keys for r in rows)
    assert rows[3]["max"] == 65504.0 and rows[1]["layout"] == "1 sign | 8 exponent | 10 mantissa"


def test_lookup_and_validation() -> None:
    assert list(FORMATS) == ["fp32", "tf32", "bf16", "fp16"]
    with pytest.raises(ValueError, match="nan_encoding"):
        FloatFormat("bad", 4, 3, ieee_special=True, nan_encoding="fn")
    with pytest.raises(ValueError, match="exp_bits"):
        FloatFormat("too wide", 11, 52)
    assert E4M3.nan_encoding == "fn" and E4M3.bias == 7 and not E4M3.has_inf


def test_round_accepts_scalars_and_any_dtype() -> None:
    out = round_to_format(1 / 3, BF16)
    assert out.dtype == torch.float64 and out.shape == () and out.item() == 0.333984375
    x = torch.tensor([[1 / 3, -2.0]], dtype=torch.bfloat16)
    assert_same(round_to_format(x, BF16), x.double(), x)  # already representable
    y = torch.tensor([1.0, 2.0])
    round_to_format(y, FP16)
    assert y.dtype == torch.float32  # input untouched
