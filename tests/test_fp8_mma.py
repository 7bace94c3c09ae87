"""``fp8.mma``: Hopper's FP8 tensor-core accumulation, bit for bit against mmaemu 0.1.0 (a
test-only dependency: an independent model of the H100 PCIe's cuBLASLt FP8 GEMMs, checked there
bit for bit; ``splitk=1`` asks it for the unsplit GEMM ``mma_accumulate`` computes).

Random dot products (over 10,000 per accumulation setting, several K, formats and scales) and
edge cases: K that is not a multiple of 32 or 128, zeros, the formats' maxima, subnormals, mixed
formats, cancellation, NaN and infinities; then the block-scaled GEMM, the tiling, the errors.
Outputs are compared as bit patterns (+0 and -0 differ, NaN is 0x7FFFFFFF)."""

from __future__ import annotations

import warnings

import pytest
import torch

from tutorial_lib import fp8
from tutorial_lib.fp8 import mma
from tutorial_lib.fp8.mma import mma_accumulate, mma_block_scaled

try:
    import mmaemu
except ModuleNotFoundError as error:  # a dev dependency, as ml_dtypes is: fail, never skip
    raise ModuleNotFoundError(
        f"{error}. mmaemu is the reference these tests compare against: pip install -e '.[dev]'"
    ) from error

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMATS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)]
FORMAT_IDS = ["e4m3-e4m3", "e4m3-e5m2", "e5m2-e4m3", "e5m2-e5m2"]
ODD_K = (1, 31, 33, 127, 129, 300)


def reference(a: torch.Tensor, b: torch.Tensor, fast: bool) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its notes on the profile's maturity
        return mmaemu.accumulate(a, b, use_fast_accum=fast, splitk=1)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    differ = got.view(torch.int32) != want.view(torch.int32)
    assert not differ.any(), (
        f"{int(differ.sum())} of {differ.numel()} outputs differ, e.g. {got[differ][:4].tolist()} "
        f"instead of {want[differ][:4].tolist()}"
    )


def finite_codes(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Uniformly random codes of every finite value (all exponents, subnormals, zeros)."""
    codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)
    x = codes.view(dtype)
    return torch.where(torch.isfinite(x.float()), x.float(), 0.0).to(dtype)


def gaussian(shape: tuple[int, ...], dtype: torch.dtype, scale: float, gen: torch.Generator):
    limit = 448.0 if dtype == E4M3 else 57344.0
    return (torch.randn(shape, generator=gen) * scale).clamp(-limit, limit).to(dtype)


# ---- random dot products -------------------------------------------------------------------
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "split"])
def test_random_dot_products_match_mmaemu(fast: bool) -> None:
    """4 format pairs x 6 data kinds x 3 K: 72 GEMMs of 64 x 4 dot products, 18,432 per
    setting (K 100, 257 and 640 span one to five promotions)."""
    gen = torch.Generator().manual_seed(0)
    count = 0
    for fa, fb in FORMATS:
        for k in (100, 257, 640):
            kinds = [finite_codes((64, k), fa, gen), finite_codes((4, k), fb, gen)]
            for scale in (2.0**-12, 1.0, 20.0, 3000.0):
                kinds += [gaussian((64, k), fa, scale, gen), gaussian((4, k), fb, scale, gen)]
            mixed = gaussian((64, k), fa, 1.0, gen), finite_codes((4, k), fb, gen)
            kinds += list(mixed)
            for a, b in zip(kinds[::2], kinds[1::2], strict=True):
                assert_bits_equal(mma_accumulate(a, b, fast_accum=fast), reference(a, b, fast))
                count += a.shape[0] * b.shape[0]
    assert count >= 10_000


@pytest.mark.parametrize("formats", FORMATS, ids=FORMAT_IDS)
def test_odd_k_match_mmaemu(formats: tuple[torch.dtype, torch.dtype]) -> None:
    """K that is not a multiple of 32 or of 128: the last block and chain are zero-padded."""
    gen = torch.Generator().manual_seed(1)
    for k in ODD_K:
        a, b = finite_codes((16, k), formats[0], gen), gaussian((3, k), formats[1], 4.0, gen)
        for fast in (True, False):
            assert_bits_equal(mma_accumulate(a, b, fast_accum=fast), reference(a, b, fast))


# ---- edge cases ----------------------------------------------------------------------------
def _edge_rows(k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Rows that stress the alignment: zeros, maxima, subnormals, one large value among tiny
    ones, a value and its negation, alternating signs."""
    top = 448.0 if dtype == E4M3 else 57344.0
    tiny = 2.0**-9 if dtype == E4M3 else 2.0**-16  # the smallest subnormal
    ramp = torch.arange(k, dtype=torch.float32)
    rows = [
        torch.zeros(k),
        torch.full((k,), top),
        torch.full((k,), -top),
        torch.full((k,), tiny),
        tiny * (1 + ramp % 7),  # subnormals and the smallest normals
        torch.where(ramp % 32 == 0, top, tiny),  # one large value per block among tiny ones
        torch.where(ramp % 2 == 0, 1.0, -1.0) * (1 + ramp % 5),  # x, -y: sums that cancel
        torch.where(ramp < k // 2, 3.0, -3.0),  # x then -x: cancels to exactly zero
        torch.where(ramp % 128 < 64, 100.0, -100.0) + torch.where(ramp % 3 == 0, 0.0625, 0.0),
        torch.randn(k, generator=gen) * 2.0 ** torch.randint(-10, 10, (k,), generator=gen),
    ]
    zero_blocks = torch.randn(k, generator=gen) * 8
    zero_blocks[(ramp // 32) % 2 == 1] = 0  # every other block all zero
    rows.append(zero_blocks)
    return torch.stack(rows).clamp(-top, top).to(dtype)


@pytest.mark.parametrize("formats", FORMATS, ids=FORMAT_IDS)
@pytest.mark.parametrize("k", [33, 256, 300])
def test_edge_cases_match_mmaemu(formats: tuple[torch.dtype, torch.dtype], k: int) -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = _edge_rows(k, formats[0], gen), _edge_rows(k, formats[1], gen)
    for fast in (True, False):
        got = mma_accumulate(a, b, fast_accum=fast)
        assert_bits_equal(got, reference(a, b, fast))
        assert (got[0].view(torch.int32) == 0).all()  # a zero row sums to +0, not -0


def test_cancellation_to_zero_is_plus_zero() -> None:
    """x and -x in one block, and in two chains: +0 (the tensor cores' zero), not -0."""
    x = torch.tensor([[3.0, -3.0] * 16 + [-0.5] * 128 + [0.5] * 128]).to(E4M3)
    ones = torch.ones(1, x.shape[1]).to(E4M3)
    for fast in (True, False):
        got = mma_accumulate(x, ones, fast_accum=fast)
        assert got.view(torch.int32).item() == 0
        assert_bits_equal(got, reference(x, ones, fast))


def test_long_fast_sums_keep_about_14_bits() -> None:
    """DeepSeek-V3's observation, with this model: at K = 4096 fast accumulation of positive
    products loses percents, promotion every 128 elements keeps the error near 2^-11; both as
    mmaemu computes them."""
    gen = torch.Generator().manual_seed(3)
    a = (torch.rand(8, 4096, generator=gen) * 448).to(E4M3)
    b = (torch.rand(4, 4096, generator=gen) * 448).to(E4M3)
    exact = a.double() @ b.double().t()
    errors = {}
    for fast in (True, False):
        got = mma_accumulate(a, b, fast_accum=fast)
        assert_bits_equal(got, reference(a, b, fast))
        errors[fast] = ((got.double() - exact) / exact).abs().max().item()
        assert (got <= exact.float()).all()  # truncation toward zero: positive sums fall short
    assert errors[True] > 0.01 and errors[False] < 2.0**-10, errors


@pytest.mark.parametrize("formats", [(E4M3, E4M3), (E5M2, E4M3)], ids=FORMAT_IDS[::2])
def test_nan_and_infinity_match_mmaemu(formats: tuple[torch.dtype, torch.dtype]) -> None:
    """A NaN operand makes its row's (or column's) outputs NaN; in E5M2, inf * 0 and inf - inf
    are NaN and a lone infinity gives +-inf; NaN is 0x7FFFFFFF."""
    gen = torch.Generator().manual_seed(4)
    k = 70
    a = gaussian((6, k), formats[0], 3.0, gen).float()
    b = gaussian((5, k), formats[1], 3.0, gen).float()
    a[0, 5] = float("nan")
    b[1, 40] = float("nan")
    if formats[0] == E5M2:
        a[1, 3], a[2, 9], a[2, 10] = float("inf"), float("inf"), float("-inf")
        a[3, 64] = float("-inf")
        b[2, 64] = 0.0  # -inf * 0
    a, b = a.to(formats[0]), b.to(formats[1])
    for fast in (True, False):
        got = mma_accumulate(a, b, fast_accum=fast)
        assert_bits_equal(got, reference(a, b, fast))
        assert torch.isnan(got[0]).all() and torch.isnan(got[:, 1]).all()
        assert torch.isfinite(got[4:, [0, 2, 3, 4]]).all()


# ---- fast and split; the block-scaled GEMM; tiles ------------------------------------------
def test_split_differs_from_fast_only_beyond_one_chain() -> None:
    gen = torch.Generator().manual_seed(5)
    a, b = finite_codes((32, 640), E4M3, gen), finite_codes((8, 640), E4M3, gen)
    short = a[:, :128], b[:, :128]
    assert torch.equal(
        mma_accumulate(*short, fast_accum=True), mma_accumulate(*short, fast_accum=False)
    )
    assert not torch.equal(
        mma_accumulate(a, b, fast_accum=True), mma_accumulate(a, b, fast_accum=False)
    )


def test_block_scaled_is_tile_chains_scaled_then_added_in_order() -> None:
    """Each 128-wide tile's chain (mmaemu, one chain per tile) times the two tiles' scales,
    added in float32 in K order, from +0."""
    gen = torch.Generator().manual_seed(6)
    k = 300  # tiles of 128, 128 and 44
    a, b = gaussian((24, k), E4M3, 30.0, gen), gaussian((8, k), E5M2, 30.0, gen)
    a_scales = 2.0 ** torch.randint(-8, 8, (24, 3), generator=gen).float()
    b_scales = torch.rand(8, 3, generator=gen) + 0.5  # not powers of two: the order shows
    want = torch.zeros(24, 8)
    for t in range(3):
        cols = slice(128 * t, 128 * (t + 1))
        tile = reference(a[:, cols], b[:, cols], True)
        want = want + tile * (a_scales[:, t, None] * b_scales[None, :, t])
    assert_bits_equal(mma_block_scaled(a, a_scales, b, b_scales), want)
    with pytest.raises(ValueError, match=r"b_scales must be \(8, 3\)"):
        mma_block_scaled(a, a_scales, b, b_scales[:, :2])


def test_tiles_do_not_change_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small tiles (many of them, over M and N) give the same bits as one tile."""
    gen = torch.Generator().manual_seed(7)
    a, b = finite_codes((37, 300), E4M3, gen), gaussian((29, 300), E5M2, 10.0, gen)
    whole = [mma_accumulate(a, b, fast_accum=fast) for fast in (True, False)]
    monkeypatch.setattr(mma, "TILE_PRODUCTS", 2**10)
    tile_m, tile_n = mma._tile_shape(37, 29, 3)
    assert tile_m < 37 and tile_n < 29
    for fast, want in zip((True, False), whole, strict=True):
        assert_bits_equal(mma_accumulate(a, b, fast_accum=fast), want)


def test_shapes_without_products() -> None:
    a = torch.zeros(3, 0, dtype=E4M3)
    assert torch.equal(
        mma_accumulate(a, torch.zeros(2, 0, dtype=E4M3), fast_accum=True), torch.zeros(3, 2)
    )
    assert mma_accumulate(a[:0], torch.zeros(2, 0, dtype=E4M3), fast_accum=False).shape == (0, 2)


def test_refuses_what_is_not_an_fp8_gemm() -> None:
    a = torch.ones(4, 32).to(E4M3)
    with pytest.raises(TypeError, match="float8_e4m3fn or float8_e5m2"):
        mma_accumulate(a.float(), a, fast_accum=True)
    with pytest.raises(TypeError, match="2-D"):
        mma_accumulate(a[0], a, fast_accum=True)
    with pytest.raises(ValueError, match="the same K"):
        mma_accumulate(a, a[:, :16], fast_accum=True)


def test_exported_from_fp8() -> None:
    assert fp8.mma_accumulate is mma_accumulate
