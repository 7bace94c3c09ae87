"""The per-recipe quantizers (``tutorial_lib.fp8.get_quantizer``) against independent references.

Element values and rounding are checked with ``ml_dtypes`` (numpy's float8_e4m3fn, float8_e5m2,
float8_e8m0fnu and float4_e2m1fn), never with the package's own decoders; scale rules are
recomputed here in numpy float32 from TE's rules (``recipe_common.cuh``, ``ptx.cuh``,
``core_nvfp4.cuh``, ``dequantize_nvfp4.cuh``, ``hadamard_transform.cu``; TE 2.20 where versions
differ) and torchao's (``float8_utils.amax_to_scale``).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from tutorial_lib import fp8
from tutorial_lib.fp8.formats import get_fp8_format
from tutorial_lib.fp8.quantizers import (
    QUANTIZERS,
    BlockQuantizer,
    CurrentQuantizer,
    DelayedQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
    Quantizer,
    RowwiseQuantizer,
    get_quantizer,
)
from tutorial_lib.fp8.quantizers.block import e8m0_quantize_multiplier, float_to_e8m0
from tutorial_lib.fp8.quantizers.fp4 import TE_RHT_SIGNS, e2m1_codes, rht_matrix

RECIPES = ("delayed", "current", "block", "mxfp8", "nvfp4", "rowwise")
ROLES = ("input", "weight", "grad_output")
ML = {
    "E4M3": ml_dtypes.float8_e4m3fn,
    "E5M2": ml_dtypes.float8_e5m2,
    "E2M1": ml_dtypes.float4_e2m1fn,
}
MAX = {"E4M3": 448.0, "E5M2": 57344.0, "E2M1": 6.0}
HALF_ULP = {"E4M3": 2.0**-4, "E5M2": 2.0**-3, "E2M1": 2.0**-2}  # relative, normal range
HALF_SUB = {"E4M3": 2.0**-10, "E5M2": 2.0**-17, "E2M1": 0.25}  # half the smallest subnormal
F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


# ---- independent readings of a QuantizedTensor ---------------------------------------------
def ml_values(q: QuantizedTensor) -> np.ndarray:
    """The payload decoded by ml_dtypes (float32)."""
    bits = q.data if q.fmt == "E2M1" else q.data.view(torch.uint8)
    return bits.numpy().view(ML[q.fmt]).astype(np.float32)


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    return (1, 1) if not shape else (math.prod(shape[:-1]), shape[-1])


def per_element(grid: np.ndarray, tile: tuple[int, int], rows: int, cols: int) -> np.ndarray:
    grid = grid.reshape(math.ceil(rows / tile[0]), math.ceil(cols / tile[1]))
    return np.repeat(np.repeat(grid, tile[0], axis=0), tile[1], axis=1)[:rows, :cols]


def read_multiplier(q: QuantizedTensor) -> np.ndarray:
    """Per element, the factor dequantization applies, decoded by numpy / ml_dtypes."""
    rows, cols = matrix_shape(tuple(q.shape))
    s = q.scale_inv
    if s.dtype == torch.float8_e8m0fnu:
        grid = s.view(torch.uint8).numpy().view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    elif s.dtype == torch.float8_e4m3fn:
        grid = s.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    else:
        grid = s.numpy().astype(np.float32)
    if q.tensor_scale_inv is not None:
        grid = grid * q.tensor_scale_inv.numpy().astype(np.float32)
    if grid.size == 1:
        return np.full((rows, cols), grid.reshape(()), dtype=np.float32)
    return per_element(grid, q.tile, rows, cols)


def quant_multiplier(q: QuantizedTensor, x: np.ndarray) -> np.ndarray:
    """Per element, the factor TE's rules multiply ``x`` by before rounding, rebuilt here."""
    rows, cols = x.shape
    if q.recipe == "mxfp8":  # 2^(127 - code), NaN for 255 (TE >= 2.13's exp2f_rcp)
        code = q.scale_inv.view(torch.uint8).numpy().astype(np.int32)
        mult = np.where(code == 255, np.nan, np.ldexp(F32(1), 127 - code)).astype(np.float32)
        return per_element(mult, q.tile, rows, cols)
    if q.recipe == "nvfp4":  # enc_b = min(1 / (s_b * (1 / S_enc)), FLT_MAX)
        amax = F32(np.nanmax(np.abs(x))) if x.size else F32(0)
        s_b = q.scale_inv.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
        with np.errstate(divide="ignore", over="ignore"):
            s_enc = F32(1) if amax in (0, np.inf) else min(F32(2688) / amax, FLT_MAX)
            enc = np.minimum(F32(1) / (s_b.astype(np.float32) * (F32(1) / s_enc)), FLT_MAX)
        return per_element(enc, q.tile, rows, cols)
    if q.recipe == "current":  # fmt.max / amax in float32; FLT_MAX if that overflows; 1 if 0/inf
        amax = F32(np.nanmax(np.abs(x))) if x.size else F32(0)
        with np.errstate(divide="ignore", over="ignore"):
            scale = F32(1) if amax in (0, np.inf) else min(F32(MAX[q.fmt]) / amax, FLT_MAX)
        return np.full(x.shape, scale, dtype=np.float32)
    return F32(1) / read_multiplier(q)  # power-of-two scales: the reciprocal is exact


def expected_payload(q: QuantizedTensor, x: np.ndarray, mult: np.ndarray) -> np.ndarray:
    """RNE of the scaled input by ml_dtypes, saturated to the format (TE's satfinite)."""
    top = MAX[q.fmt]
    return np.clip(x * mult, -top, top).astype(ML[q.fmt]).astype(np.float32)


def check_payload(q: QuantizedTensor, x: torch.Tensor, mult: np.ndarray | None = None) -> None:
    """``data`` holds exactly ml_dtypes' rounding of ``x * multiplier``; NaN handled per format."""
    xm = x.reshape(matrix_shape(tuple(x.shape))).numpy().astype(np.float32)
    got = ml_values(q).reshape(xm.shape)
    want = expected_payload(q, xm, quant_multiplier(q, xm) if mult is None else mult)
    nan = np.isnan(xm)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    if q.fmt == "E2M1":  # E2M1 has no NaN: TE's reference writes code 0
        assert (q.data.reshape(xm.shape).numpy()[nan] == 0).all()
    else:
        assert np.isnan(got[nan]).all()


def check_error_bound(q: QuantizedTensor, x: torch.Tensor) -> None:
    """|dequantize - x| <= half an ulp of the element (relative) plus half the smallest
    subnormal step times the tile's multiplier; NVFP4 also loses what saturates above 6."""
    xm = x.reshape(matrix_shape(tuple(x.shape))).to(torch.float32).numpy()
    dq = q.dequantize(torch.float32).reshape(xm.shape).numpy()
    m = read_multiplier(q).astype(np.float64)
    a = np.abs(xm.astype(np.float64))
    bound = HALF_ULP[q.fmt] * a + HALF_SUB[q.fmt] * m + 1e-6 * a + 1e-30
    if q.fmt == "E2M1":
        bound += np.maximum(a - MAX["E2M1"] * m, 0)
    finite = np.isfinite(xm)
    err = np.abs(dq[finite].astype(np.float64) - xm[finite])
    assert (err <= bound[finite]).all(), f"{q}: worst excess {(err - bound[finite]).max()}"


def make(recipe: str, role: str, **options: object) -> Quantizer:
    return fp8.get_quantizer(recipe, role, **options)


def fitted(recipe: str, role: str, x: torch.Tensor) -> Quantizer:
    """The recipe's quantizer; for delayed scaling with a scale that a history fitting ``x``
    would give (a power of two at most max/amax), so that nothing saturates."""
    if recipe != "delayed":
        return make(recipe, role)
    top = 57344.0 if role == "grad_output" else 448.0
    amax = torch.nan_to_num(x, nan=0.0).abs().max().item() if x.numel() else 0.0
    scale = 2.0 ** min(math.floor(math.log2(top / amax)), 127) if amax else 1.0
    return make(recipe, role, scale=scale)


def wide(*shape: int, seed: int = 0) -> torch.Tensor:
    """Normal values spread over 2^-8 .. 2^8 per element: every tile has its own range."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-8, 9, shape, generator=g))


def edge_cases() -> dict[str, torch.Tensor]:
    x = wide(130, 260, seed=1)
    zero_tile = x.clone()
    zero_tile[:128, :128] = 0.0
    at_max = wide(32, 64, seed=2)
    at_max[0, :6] = torch.tensor([448.0, -448.0, 57344.0, -57344.0, 6.0, -6.0])
    nan = wide(40, 64, seed=16)
    nan[::7, ::5] = float("nan")
    return {
        "nan": nan,
        "random": x,
        "zeros": torch.zeros(40, 96),
        "zero_tile": zero_tile,
        "subnormal": wide(16, 64, seed=3) * 1e-39,
        "at_max": at_max,
    }


# ---- the factory ------------------------------------------------------------------------------
def test_names_roles_and_te_class_names() -> None:
    te = {
        "DelayedScaling": DelayedQuantizer,
        "Float8CurrentScaling": CurrentQuantizer,
        "Float8BlockScaling": BlockQuantizer,
        "MXFP8BlockScaling": MXFP8Quantizer,
        "NVFP4BlockScaling": NVFP4Quantizer,
    }
    for name, cls in te.items():
        assert type(get_quantizer(name, "weight")) is cls
        assert type(get_quantizer(cls.recipe, "weight")) is cls
    assert type(get_quantizer("rowwise", "input")) is RowwiseQuantizer
    assert set(QUANTIZERS) == set(RECIPES)
    assert fp8.get_quantizer is get_quantizer


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(ValueError, match="'delayed', 'current', 'block', 'mxfp8', 'nvfp4'"):
        get_quantizer("tensorwise", "input")
    with pytest.raises(ValueError, match="'input', 'weight', 'grad_output'"):
        get_quantizer("current", "output")
    with pytest.raises(TypeError, match="'power_2_scale'"):
        get_quantizer("current", "input", power2=True)
    with pytest.raises(ValueError, match="E5M2"):
        get_quantizer("current", "input", fp8_format="e5m2")
    with pytest.raises(ValueError, match="block_scaling_dim"):
        get_quantizer("block", "input", block_scaling_dim=3)


@pytest.mark.parametrize(
    ("recipe", "formats", "tiles"),
    [
        ("delayed", ("E4M3", "E4M3", "E5M2"), None),
        ("current", ("E4M3", "E4M3", "E5M2"), None),
        ("block", ("E4M3", "E4M3", "E4M3"), ((1, 128), (128, 128), (1, 128))),
        ("mxfp8", ("E4M3", "E4M3", "E4M3"), ((1, 32),) * 3),
        ("nvfp4", ("E2M1", "E2M1", "E2M1"), ((1, 16), (16, 16), (1, 16))),
        ("rowwise", ("E4M3", "E4M3", "E4M3"), None),
    ],
)
def test_te_defaults_per_role(recipe: str, formats: tuple[str, ...], tiles: tuple | None) -> None:
    x = wide(256, 256)
    for i, role in enumerate(ROLES):
        q = make(recipe, role).quantize(x)
        assert q.fmt == formats[i] and q.role == role and q.recipe == recipe
        if tiles:
            assert q.tile == tiles[i]


def test_te_default_options() -> None:
    block, current = get_quantizer("block", "input"), get_quantizer("current", "input")
    assert isinstance(block, BlockQuantizer) and isinstance(current, CurrentQuantizer)
    assert block.power_2_scale and block.amax_epsilon == 0.0
    assert not current.power_2_scale and current.amax_epsilon == 0.0
    nv = get_quantizer("nvfp4", "grad_output")
    assert isinstance(nv, NVFP4Quantizer) and not nv.rht and not nv.stochastic_rounding


# ---- every recipe, every edge case -------------------------------------------------------
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("case", list(edge_cases()))
def test_roundtrip_bound_and_exact_payload(recipe: str, case: str) -> None:
    x = edge_cases()[case]
    for role in ROLES:
        q = fitted(recipe, role, x).quantize(x)
        assert q.data.shape == x.shape
        check_payload(q, x)  # NaN stays NaN (E2M1: code 0)
        if not (recipe == "rowwise" and case == "nan"):  # torchao: a NaN poisons its row
            check_error_bound(q, x)
        if case == "zeros" or case == "zero_tile":
            zero = x == 0
            assert (q.dequantize()[zero] == 0).all()


SHAPES = [(5, 123), (3, 7, 45), (200,), (1, 1), (130, 260), (), (0, 16)]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_odd_shapes(recipe: str, shape: tuple[int, ...]) -> None:
    x = wide(*shape, seed=4) if shape else torch.tensor(3.25)
    rows, cols = matrix_shape(shape)
    for role in ROLES:
        q = fitted(recipe, role, x).quantize(x)
        assert q.data.shape == x.shape and q.dequantize().shape == x.shape
        if recipe in ("delayed", "current"):
            assert q.scale_inv.shape == ()
        elif recipe == "rowwise":
            assert q.scale_inv.shape == (rows,)
        else:
            tr, tc = q.tile
            assert q.scale_inv.shape == (math.ceil(rows / tr), math.ceil(cols / tc))
        check_payload(q, x)
        check_error_bound(q, x)


def test_dequantize_returns_the_input_dtype() -> None:
    x = wide(32, 64).to(torch.bfloat16)
    for recipe in RECIPES:
        q = make(recipe, "input").quantize(x)
        assert q.dequantize().dtype == torch.bfloat16
        assert q.dequantize(torch.float64).dtype == torch.float64


# ---- per-tensor recipes ----------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_current_matches_quantize_with_max_over_amax_bit_for_bit(role: str) -> None:
    x = wide(70, 90, seed=5)
    q = make("current", role).quantize(x)
    fmt = get_fp8_format(q.fmt.lower())
    scale = torch.tensor(fmt.max, dtype=torch.float32) / x.abs().amax()
    assert torch.equal(q.data.view(torch.uint8), fp8.quantize(x, fmt, scale).view(torch.uint8))
    assert torch.equal(q.scale_inv, torch.reciprocal(scale))


def test_current_power_2_scale_and_epsilon_floor() -> None:
    x = wide(50, 50, seed=6)
    q = make("current", "input", power_2_scale=True).quantize(x)
    quotient = F32(448) / F32(x.abs().amax().item())
    assert q.scale_inv.item() == 2.0 ** -math.floor(math.log2(quotient))
    check_payload(q, x, mult=np.full((50, 50), 1 / F32(q.scale_inv.item()), dtype=np.float32))
    tiny = x * 1e-7  # amax about 1e-5, below the floor
    q = make("current", "input", amax_epsilon=1e-2).quantize(tiny)
    assert q.scale_inv.item() == 1 / (F32(448) / F32(1e-2))  # scale = 448 / epsilon
    assert torch.equal(q.data, fp8.quantize(tiny, fp8.E4M3, float(F32(448) / F32(1e-2))))


def test_current_scale_rules_at_zero_inf_and_nan() -> None:
    q = make("current", "input").quantize(torch.zeros(4, 16))
    assert q.scale_inv.item() == 1.0 and (q.dequantize() == 0).all()
    x = wide(8, 16, seed=7)
    x[0, 0], x[1, 1] = float("inf"), float("-inf")
    q = make("current", "input").quantize(x)  # amax inf -> scale 1 (TE's kernel rule)
    assert q.scale_inv.item() == 1.0
    assert q.dequantize()[0, 0] == 448 and q.dequantize()[1, 1] == -448
    assert torch.equal(q.data.view(torch.uint8), fp8.quantize(x, fp8.E4M3, 1.0).view(torch.uint8))
    y = wide(8, 16, seed=8)
    with_nan = y.clone()
    with_nan[2, 3] = float("nan")
    q, ref = make("current", "input").quantize(with_nan), make("current", "input").quantize(y)
    assert q.scale_inv == ref.scale_inv and torch.isnan(q.dequantize()[2, 3])
    keep = ~torch.isnan(with_nan)
    assert torch.equal(q.dequantize()[keep], ref.dequantize()[keep])
    assert q.amax == y.abs().amax()  # NaN skipped, as TE's fmaxf reduction


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("scale", [1.0, 3.7, 0.01])
def test_delayed_equals_quantize_with_the_given_scale(role: str, scale: float) -> None:
    x = wide(20, 48, seed=9)
    x[0, 0], x[1, 1] = float("nan"), float("-inf")
    q = make("delayed", role, scale=torch.tensor(scale)).quantize(x)
    fmt = fp8.E5M2 if role == "grad_output" else fp8.E4M3
    assert q.fmt == fmt.name and q.values()[1, 1] == -fmt.max  # inf saturates (satfinite)
    assert torch.equal(q.data.view(torch.uint8), fp8.quantize(x, fmt, scale).view(torch.uint8))
    assert q.scale_inv == torch.reciprocal(torch.tensor(scale, dtype=torch.float32))
    assert q.amax == float("inf")  # what TE records into row 0: NaN skipped, inf kept
    check_payload(q, x, mult=np.full((20, 48), F32(scale)))


def test_rowwise_follows_torchao() -> None:
    x = wide(6, 40, seed=10)
    x[1] = 0.0
    x[2, 5], x[3, 7] = float("nan"), float("inf")
    q = make("rowwise", "weight").quantize(x)
    amax = np.abs(x.numpy().astype(np.float64)).max(axis=1)
    for r in (0, 4, 5, 1):  # scale = 2^floor(log2(float32(448 / max(amax, 1e-12))))
        scale = F32(448.0 / max(amax[r], 1e-12))
        assert q.scale_inv[r].item() == 2.0 ** -math.floor(math.log2(scale))
    dq = q.dequantize()
    assert (dq[1] == 0).all()
    assert torch.isnan(dq[2]).all() and torch.isnan(dq[3]).all()  # no special case in torchao
    check_error_bound(make("rowwise", "input").quantize(x[[0, 1, 4, 5]]), x[[0, 1, 4, 5]])


# ---- block scaling -------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_block_scales_are_powers_of_two_fitted_per_tile(role: str) -> None:
    x = edge_cases()["zero_tile"]
    x[129, 259] = float("nan")
    q = make("block", role).quantize(x)
    tr, tc = q.tile
    amax = np.zeros(q.scale_inv.shape)
    xa = np.nan_to_num(np.abs(x.numpy()), nan=0.0)
    for i, j in np.ndindex(amax.shape):
        amax[i, j] = xa[i * tr : (i + 1) * tr, j * tc : (j + 1) * tc].max()
    s = q.scale_inv.numpy().astype(np.float64)
    zero = amax == 0
    assert (s[zero] == 1).all()  # an all-zero tile keeps scale 1
    expected = np.exp2(-np.floor(np.log2(F32(448) / amax[~zero].astype(np.float32))))
    np.testing.assert_array_equal(s[~zero], expected)
    fill = amax[~zero] / s[~zero]
    assert ((fill > 224) & (fill <= 448)).all()  # power-of-two rounding wastes < 1 binade


def test_block_inf_tile_and_epsilon() -> None:
    x = wide(4, 256, seed=11)
    x[0, 3] = float("inf")
    q = make("block", "input").quantize(x)
    assert q.scale_inv[0, 0] == 1 and q.dequantize()[0, 3] == 448
    assert q.scale_inv[0, 1] != 1 and q.scale_inv[1, 0] != 1
    tiny = torch.full((1, 128), 1e-6)
    q = make("block", "input", amax_epsilon=1e-3).quantize(tiny)
    assert q.scale_inv.item() == 2.0 ** -math.floor(math.log2(F32(448) / F32(1e-3)))


def test_block_value_for_inf_is_the_input_dtype_max() -> None:
    tiny = torch.full((1, 128), 1e-38, dtype=torch.bfloat16)  # 448 / amax overflows float32
    q = make("block", "input", power_2_scale=False).quantize(tiny)
    assert q.scale_inv.item() == 1 / F32(torch.finfo(torch.bfloat16).max)
    q = make("block", "input").quantize(tiny)
    assert q.scale_inv.item() == 2.0**-127  # power of two below bfloat16's max


# ---- MXFP8 ------------------------------------------------------------------------------------
def test_float_to_e8m0_rounds_up_and_saturates() -> None:
    bits = [0, 1, 0x00400000, 0x00400001, 0x00800000, 0x3F800000, 0x3F800001, 0x7F000000]
    bits += [0x7F7FFFFF, 0x7F800000, 0x7FC00000]
    v = torch.tensor(bits, dtype=torch.int32).view(torch.float32)
    expected = [0, 0, 0, 1, 1, 127, 128, 254, 254, 254, 255]
    assert float_to_e8m0(v).tolist() == expected


@pytest.mark.parametrize("role", ROLES)
def test_mxfp8_exponents_are_the_smallest_power_of_two_that_fits(role: str) -> None:
    x = edge_cases()["zero_tile"]
    q = make("mxfp8", role, fp8_format="hybrid").quantize(x)
    fmt = "E5M2" if role == "grad_output" else "E4M3"
    assert q.fmt == fmt and q.scale_inv.dtype == torch.float8_e8m0fnu
    padded = np.pad(np.abs(x.numpy()), ((0, 0), (0, 28)))  # 260 = 8 * 32 + 4: pad the 9th
    amax = padded.reshape(130, 9, 32).max(axis=2)
    v = amax.astype(np.float32) * (F32(1) / F32(MAX[fmt]))
    scale = read_multiplier(q)[:, ::32]  # ml_dtypes' reading of the E8M0 bytes
    assert (np.log2(scale) == np.round(np.log2(scale))).all()
    nonzero = v > 0
    assert (scale[nonzero] >= v[nonzero]).all() and (scale[nonzero] / 2 < v[nonzero]).all()
    assert (q.scale_inv.view(torch.uint8).numpy()[~nonzero] == 0).all()
    assert (np.abs(ml_values(q)) <= MAX[fmt]).all()  # rounding up: nothing saturates


def test_mxfp8_inf_block() -> None:
    x = wide(2, 64, seed=12)
    x[0, 40] = float("inf")
    q = make("mxfp8", "input").quantize(x)
    assert q.scale_inv.view(torch.uint8)[0, 1] == 254
    assert q.dequantize()[0, 40] == float("inf")
    clean = make("mxfp8", "input").quantize(torch.where(torch.isinf(x), 0.0, x))
    other = torch.ones(2, 64, dtype=torch.bool)
    other[0, 32:] = False
    assert torch.equal(q.data.view(torch.uint8)[other], clean.data.view(torch.uint8)[other])


def mxfp8_reference(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TE 2.20's MXFP8 E4M3 cast of a float32 ``(rows, 32 k)`` matrix, rebuilt in float64 and
    ml_dtypes: (codes, payload, dequantized). Per 1x32 block: amax with NaN skipped (``fmaxf``),
    ``code`` = the exponent of ``amax * float32(1/448)`` rounded up, at least 0, inf giving 254
    (``float_to_e8m0``); payload = E4M3(x * 2^(127 - code)) satfinite (``exp2f_rcp``, TE >=
    2.13); dequantized = payload * 2^(code - 127) in float32 (``exp2f``, TE >= 2.19)."""
    xm = x.numpy().astype(np.float64)
    rows, cols = xm.shape
    blocks = np.abs(xm).reshape(rows, cols // 32, 32)
    amax = np.where(np.isnan(blocks), 0.0, blocks).max(axis=2).astype(np.float32)
    v = (amax * (F32(1) / F32(448))).astype(np.float64)
    mantissa, exponent = np.frexp(np.where(np.isinf(v), 0.0, v))
    code = np.where(mantissa == 0.5, exponent - 1, exponent) + 127  # smallest 2^e >= v
    code = np.where(np.isinf(v), 254, np.where(v == 0, 0, np.clip(code, 0, 254)))
    mult = np.repeat(np.ldexp(1.0, 127 - code), 32, axis=1)
    with np.errstate(invalid="ignore"):
        scaled = np.clip((xm * mult).astype(np.float32), -448, 448)
    payload = scaled.astype(ML["E4M3"]).astype(np.float64)
    with np.errstate(over="ignore"):
        dequantized = (payload / mult).astype(np.float32)  # 448 * 2^127 overflows to inf
    return code, payload, dequantized


def test_e8m0_quantize_multiplier_is_tes_exp2f_rcp() -> None:
    """TE >= 2.13 (PR #2647; ``exp2f_rcp``, ``common/util/ptx.cuh``; TE 2.20 unchanged): code c
    multiplies by 2^(127 - c) for every c up to 254, so code 0 by 2^127 (TE <= 2.12: by 1) and
    254 by the subnormal 2^-127; code 255, E8M0's NaN, gives NaN."""
    got = e8m0_quantize_multiplier(torch.arange(256, dtype=torch.int32).to(torch.uint8))
    assert got.dtype == torch.float32
    want = np.ldexp(1.0, 127 - np.arange(255))
    np.testing.assert_array_equal(got[:255].numpy().astype(np.float64), want)
    assert torch.isnan(got[255])


def test_mxfp8_tiny_blocks_keep_their_values() -> None:
    """A block with ``amax * (1/448) <= 2^-127`` (amax up to about 2.6e-36) gets code 0, and
    since TE 2.13 its elements are scaled by 2^127 rather than flushed to zero; TE 2.20 reads
    code 0 back as 2^-127, so the block round-trips with E4M3's precision."""
    g = torch.Generator().manual_seed(17)
    x = torch.randn(4, 64, generator=g)
    for r, amax in ((0, 2e-36), (1, 1e-39), (2, 2e-36)):  # normal, subnormal, normal + NaN
        x[r, :32] *= amax / x[r, :32].abs().max()
    x[2, 7] = float("nan")  # skipped by the amax: the block is scaled as without it
    x[3, :32] = 0.0
    code, payload, dequantized = mxfp8_reference(x)
    assert (code[:, 0] == 0).all() and (code[:, 1] > 0).all()
    q = make("mxfp8", "input").quantize(x)
    np.testing.assert_array_equal(q.scale_inv.view(torch.uint8).numpy(), code)
    np.testing.assert_array_equal(ml_values(q), payload)
    np.testing.assert_array_equal(q.dequantize().numpy(), dequantized)
    xt, dq = x[:3, :32].numpy().astype(np.float64), dequantized[:3, :32].astype(np.float64)
    normal = np.abs(xt) >= 2.0**-133  # E4M3's normal range (2^-6) once scaled by 2^127
    assert normal.sum() > 80
    assert (np.abs(dq - xt)[normal] <= HALF_ULP["E4M3"] * np.abs(xt[normal])).all()


def test_mxfp8_non_finite_blocks() -> None:
    """Blocks with inf or NaN, by TE 2.20's rules (``mxfp8_reference``): NaN stays NaN and never
    enters the amax, so a tiny block holding one is still scaled by 2^127 and an all-NaN block
    gets code 0; an inf gives code 254 and multiplier 2^-127 (TE >= 2.13; before, 0 turned
    inf into NaN), so it saturates to 448, reads back as inf, and its finite neighbours go
    to zero."""
    x = wide(2, 128, seed=18)
    x[0, 3], x[0, 4], x[0, 40] = float("inf"), float("nan"), float("-inf")
    x[0, 64:96] = float("nan")
    x[1, :32] *= 1e-37 / x[1, :32].abs().max()
    x[1, 9] = float("nan")
    code, payload, dequantized = mxfp8_reference(x)
    assert code[0, :3].tolist() == [254, 254, 0] and code[1, 0] == 0
    q = make("mxfp8", "input").quantize(x)
    np.testing.assert_array_equal(q.scale_inv.view(torch.uint8).numpy(), code)
    np.testing.assert_array_equal(ml_values(q), payload)
    np.testing.assert_array_equal(q.dequantize().numpy(), dequantized)
    assert payload[0, 3] == 448 and payload[0, 40] == -448 and np.isnan(payload[0, 4])
    assert dequantized[0, 3] == np.inf and np.count_nonzero(payload[1, :32]) > 20


# ---- NVFP4 -----------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_nvfp4_two_level_scale_rules(role: str) -> None:
    x = edge_cases()["zero_tile"]
    q = make("nvfp4", role).quantize(x)
    amax = F32(np.abs(x.numpy()).max())
    assert q.amax.item() == amax
    assert q.tensor_scale_inv is not None
    assert q.tensor_scale_inv.item() == amax * F32(1 / 2688)
    s_enc = F32(2688) / amax
    tr, tc = q.tile
    xa = np.pad(np.abs(x.numpy()), ((0, -130 % tr), (0, -260 % tc)))
    block_amax = xa.reshape(xa.shape[0] // tr, tr, -1, tc).max(axis=(1, 3))
    wanted = np.minimum(block_amax * (s_enc * F32(1 / 6)), FLT_MAX)
    wanted = np.clip(wanted, 0, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    got = q.scale_inv.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(got, wanted)
    assert q.data.dtype == torch.uint8 and int(q.data.max()) < 16


def test_nvfp4_zero_inf_and_nan() -> None:
    q = make("nvfp4", "input").quantize(torch.zeros(16, 32))
    assert q.tensor_scale_inv == 0 and (q.data == 0).all() and (q.dequantize() == 0).all()
    x = wide(16, 32, seed=13)
    x[0, 0] = float("inf")
    q = make("nvfp4", "input").quantize(x)  # amax inf: S_enc 1 (TE), 448 block scale
    assert q.amax == float("inf") and q.scale_inv[0, 0].float() == 448
    assert q.data[0, 0] == 7  # +6
    y = wide(16, 32, seed=14)
    y[3, 4] = float("nan")
    q = make("nvfp4", "input").quantize(y)
    assert q.data[3, 4] == 0
    clean = make("nvfp4", "input").quantize(torch.nan_to_num(y, nan=0.0))
    assert torch.equal(q.data, clean.data) and torch.equal(q.scale_inv, clean.scale_inv)


def test_e2m1_ties_go_to_even_and_values_saturate() -> None:
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, -0.25, 0.3, 5.9, 7.0, -1e9]
    x = torch.tensor(ties + [float("inf")], dtype=torch.float32)
    want = np.clip(x.numpy(), -6, 6).astype(ML["E2M1"]).view(np.uint8)
    assert e2m1_codes(x).tolist() == want.tolist()
    # Through NVFP4: tensor amax 5.25 makes S_enc = 2688 / 5.25 = 512 exactly; a block with amax
    # 3 gets s_b = e4m3(3 * 512 / 6) = 256, so enc_b = 1 / (256 / 512) = 2 and x * 2 hits ties.
    row = torch.zeros(1, 32)
    row[0, 0] = 5.25
    row[0, 16:29] = torch.tensor([3.0] + [t / 2 for t in ties[:11]] + [-3.0])
    q = make("nvfp4", "input").quantize(row)
    assert q.scale_inv[0, 1].float() == 256 and q.amax == 5.25
    check_payload(q, row)
    assert q.values()[0, 17:24].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_nvfp4_random_hadamard_transform() -> None:
    t = rht_matrix()
    assert torch.equal(t @ t.T, torch.eye(16)) and set(t.abs().unique().tolist()) == {0.25}
    x = wide(64, 64, seed=15)
    q = make("nvfp4", "grad_output", rht=True).quantize(x)
    assert q.rht and q.amax == (x.reshape(64, 4, 16) @ t).abs().max()
    dq = q.dequantize()
    assert torch.linalg.norm(dq - x) / torch.linalg.norm(x) < 0.2
    check_payload(q, (x.reshape(64, 4, 16) @ t).reshape(64, 64))  # data encodes x @ T
    with pytest.raises(ValueError, match="divisible by 16"):
        make("nvfp4", "input", rht=True).quantize(wide(4, 40))
    with pytest.raises(ValueError, match="1x16"):
        make("nvfp4", "weight", rht=True)


def test_nvfp4_stochastic_rounding_is_seeded_and_unbiased() -> None:
    row = torch.linspace(-5.5, 5.5, 16)  # amax 5.5 -> block scale maps it to about 6
    x = row.repeat(4000, 1)

    def quantized(seed: int) -> QuantizedTensor:
        g = torch.Generator().manual_seed(seed)
        return make("nvfp4", "grad_output", stochastic_rounding=True, generator=g).quantize(x)

    a, b, c = quantized(0), quantized(0), quantized(1)
    assert torch.equal(a.data, b.data) and not torch.equal(a.data, c.data)
    dq = a.dequantize()
    nearest = make("nvfp4", "grad_output").quantize(x).dequantize()
    assert ((dq - x).abs() <= 2 * (nearest - x).abs().max() + 1e-6).all()  # a neighbour only
    assert (dq.mean(dim=0) - row).abs().max() < 0.06  # unbiased; nearest rounding is not
    assert (nearest.mean(dim=0) - row).abs().max() > 0.1


def hadamard16() -> np.ndarray:
    """TE's 16x16 transform, built here in float64: ``diag(signs) @ H / 4``, ``H`` Sylvester's."""
    h = np.ones((1, 1))
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    return np.diag(np.array(TE_RHT_SIGNS, dtype=np.float64)) @ h / 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_nvfp4_rht_output_is_rounded_to_the_input_dtype(dtype: torch.dtype) -> None:
    """TE rounds the transform of a BF16 input to BF16 before the amax and the casts (TE 2.9 to
    2.20: ``hadamard_transform.cu`` writes BF16, the fused kernel rounds its FP32 sums "for
    bit-wise compatibility", ``reference_nvfp4.py`` multiplies in ``x.dtype``). TE's kernels
    take BF16 only; its reference rounds an FP16 input's transform to FP16, and so do we."""
    g = torch.Generator().manual_seed(19)
    x = (torch.randint(-1024, 1025, (32, 64), generator=g) / 64).to(dtype)
    exact = (x.float().numpy().astype(np.float64).reshape(32, 4, 16) @ hadamard16()).reshape(32, 64)
    assert (exact.astype(np.float32) == exact).all()  # one rounding: FP32 holds these sums
    narrow = ml_dtypes.bfloat16 if dtype == torch.bfloat16 else np.float16
    y = exact.astype(np.float32).astype(narrow).astype(np.float32)
    assert (y != exact).mean() > 0.1  # the rounding matters for these values
    q = make("nvfp4", "grad_output", rht=True).quantize(x)
    assert q.amax.item() == np.abs(y).max()
    check_payload(q, torch.from_numpy(y))
    plain = make("nvfp4", "grad_output").quantize(torch.from_numpy(y))
    assert torch.equal(q.scale_inv.view(torch.uint8), plain.scale_inv.view(torch.uint8))
    assert torch.equal(q.data, plain.data)


def nvfp4_dequantized(q: QuantizedTensor) -> np.ndarray:
    """TE's NVFP4 dequantize (``dequantize_nvfp4.cuh``, TE 2.9 to 2.20), in numpy float32:
    ``value * ((s_b * amax) * float32(1/2688))``, left to right; ``(s_b * amax)`` may overflow."""
    rows, cols = matrix_shape(tuple(q.shape))
    s_b = q.scale_inv.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        final = (s_b * F32(q.amax.item())) * (F32(1) / F32(2688))
        return ml_values(q).reshape(rows, cols) * per_element(final, q.tile, rows, cols)


@pytest.mark.parametrize("role", ["input", "weight"])
def test_nvfp4_dequantize_associates_as_tes_kernel(role: str) -> None:
    x = wide(64, 128, seed=20)
    q = make("nvfp4", role).quantize(x)
    want = nvfp4_dequantized(q)
    np.testing.assert_array_equal(q.dequantize().numpy(), want)
    np.testing.assert_array_equal(
        q.dequantize(torch.bfloat16).float().numpy(),
        want.astype(ml_dtypes.bfloat16).astype(np.float32),
    )
    rows, cols = 64, 128
    s_b = q.scale_inv.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    other = s_b * (F32(q.amax.item()) * (F32(1) / F32(2688)))  # the other association
    nonzero = ml_values(q) != 0
    differs = ml_values(q) * per_element(other, q.tile, rows, cols) != want
    assert differs[nonzero].mean() > 0.05  # one ulp apart on many elements


def test_nvfp4_dequantize_overflows_where_te_does() -> None:
    """``s_b * amax`` passes FLT_MAX when amax > FLT_MAX / s_b: the amax's own block has
    s_b = 448, so any tensor with amax above about 7.6e35. TE's dequantize then gives +-inf
    for that block's non-zero elements and NaN (0 * inf) for its zeros; the other
    association stays finite there."""
    x = wide(16, 64, seed=21)
    x = x / x.abs().max() * 1e35
    x[0, :16] = torch.linspace(-1e36, 1e36, 16)
    x[0, 5] = 0.0
    q = make("nvfp4", "input").quantize(x)
    assert q.scale_inv[0, 0].float() == 448
    want = nvfp4_dequantized(q)
    got = q.dequantize().numpy()
    np.testing.assert_array_equal(got, want)
    values, block = ml_values(q)[0, :16], got[0, :16]
    assert np.isinf(block[values != 0]).all() and np.isnan(block[values == 0]).all()
    assert (values != 0).sum() >= 10 and np.isnan(block[5])
    assert np.isfinite(got[1:]).all()  # blocks whose s_b * amax fits stay finite
