"""Our ``current`` and ``rowwise`` quantizers against torchao's float8 training, run on the CPU.

torchao (a dev dependency, pinned in pyproject.toml) is the peer implementation of both recipes:
its tensorwise recipe is current scaling, its rowwise recipe is where ``RowwiseQuantizer``'s rules
come from. Three levels, all on the same tensors:

1. Scale rules (``float8_utils.amax_to_scale``) against TE's (``quantizers.base.scale_from_amax``),
   over every positive bfloat16 value and 1M random float32 bit patterns as the amax.
2. Casts: torchao's ``hp_tensor_to_float8_dynamic`` against ``get_quantizer(...).quantize``,
   payload bytes and scales compared bit for bit (odd shapes, zero rows, 1e-9 to 1e30, fp32 and
   bf16). Where TE's rule and torchao's differ, the difference is asserted, not skipped:
     - torchao floors the amax at ``EPS = 1e-12`` (all-zero tensor: scale 448e12; TE: 1);
     - an inf amax gives torchao scale 0 (TE: 1); a NaN element makes torchao's whole tensor NaN
       (TE's amax skips NaN);
     - power-of-two scales: torchao takes ``exp2(floor(log2(s)))`` in float32, and ``log2`` of
       a scale a few ulps below ``2^k`` rounds to ``k``, so torchao rounds *up* there; TE clears
       the mantissa bits and always rounds down.
3. The layer: ``convert_to_float8_training`` on a two-layer MLP, forward and backward, fp32 and
   bf16, emulated (``torch.mm``; conftest's guard proves no ``torch._scaled_mm``) and through
   ``torch._scaled_mm`` on CPU tensors (marked ``cpu_scaled_mm``, 32 x 64 x 48); each of the
   three GEMMs of each layer is rebuilt from our quantizers, scaled along the axes torchao's
   ``matmul_with_hp_or_float8_args`` uses.

The tests fail (never skip) when torchao is missing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from tutorial_lib import fp8
from tutorial_lib.fp8.quantizers import QuantizedTensor
from tutorial_lib.fp8.quantizers.base import scale_from_amax
from tutorial_lib.fp8.quantizers.per_tensor import TORCHAO_EPS

try:
    import torchao.float8 as ao
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_utils import EPS as AO_EPS
    from torchao.float8.float8_utils import amax_to_scale
except ModuleNotFoundError as error:  # a dev dependency, as ml_dtypes is: fail, never skip
    raise ModuleNotFoundError(
        f"{error}. torchao is the peer these tests compare against: pip install -e '.[dev]'"
    ) from error

RECIPES = {"current": "tensorwise", "rowwise": "rowwise"}  # ours -> torchao's recipe name
ROLES = ("input", "weight", "grad_output")
DTYPES = (torch.float32, torch.bfloat16)
SHAPES = ((5, 123), (1, 1), (3, 7, 33), (32, 48))
REGIMES = ("normal", "large", "small", "zero_rows", "mixed_rows", "near_pow2")
U = 2.0**-24  # float32 unit roundoff


# ---- helpers -----------------------------------------------------------------------------------
def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes / words of ``t``, so that NaN payloads and signed zeros compare too."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_same_bits(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, what
    same = bits(ours) == bits(theirs)
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {same.numel()} differ"


def make(shape: tuple[int, ...], regime: str, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Test values; every row's amax stays above torchao's EPS, where the two tensorwise rules
    agree. ``near_pow2`` puts each row's scale a few float32 ulps below a power of two (float32
    only: bfloat16 rounds the offset away)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    rows = x.reshape(-1, shape[-1])
    n = rows.shape[0]
    if regime == "large":
        x = x * 1e30
    elif regime == "small":
        x = x * 1e-9
    elif regime == "zero_rows":
        rows[1::3] = 0.0
    elif regime == "mixed_rows":
        rows *= torch.logspace(-9, 30, n)[:, None]
    elif regime == "near_pow2":  # amax 448 * 2^-k (1 + j 2^-23), scale 2^k (1 - j 2^-23)
        r = torch.arange(n)
        amax = 448.0 * torch.exp2(60 - 7.0 * (r % 12)) * (1 + (1 + r % 3) * 2.0**-23)
        rows.mul_(amax[:, None] * 0.99 / rows.abs().amax(dim=1, keepdim=True))
        rows[:, 0] = amax
    return x.to(dtype)


def torchao_cast(
    x: torch.Tensor, recipe: str, role: str, axiswise_dim: int = -1, power_2: bool | None = None
) -> ao.Float8TrainingTensor:
    """torchao's cast of ``x`` for ``role`` under its recipe (``matmul_with_hp_or_float8_args``)."""
    config = ao.Float8LinearConfig.from_recipe_name(RECIPES[recipe])
    cast = getattr(config, f"cast_config_{role}")
    rowwise = cast.scaling_granularity is ao.ScalingGranularity.AXISWISE
    return hp_tensor_to_float8_dynamic(
        x,
        cast.target_dtype,
        ao.LinearMMConfig(),
        scaling_granularity=cast.scaling_granularity,
        axiswise_dim=axiswise_dim if rowwise else None,
        round_scales_to_power_of_2=config.round_scales_to_power_of_2
        if power_2 is None
        else power_2,
    )


def fp8_max(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max


# ---- 0. the settings we mirror -------------------------------------------------------------------
def test_torchao_recipes_use_our_formats_and_rules() -> None:
    assert AO_EPS == TORCHAO_EPS == 1e-12
    tensorwise = ao.Float8LinearConfig.from_recipe_name("tensorwise")
    rowwise = ao.Float8LinearConfig.from_recipe_name("rowwise")
    x = torch.ones(2, 16)
    for role in ROLES:
        cast = getattr(tensorwise, f"cast_config_{role}")  # TE's HYBRID: E5M2 for gradients only
        assert cast.scaling_granularity is ao.ScalingGranularity.TENSORWISE
        assert cast.target_dtype == fp8.get_quantizer("current", role).quantize(x).data.dtype
        cast = getattr(rowwise, f"cast_config_{role}")  # E4M3 everywhere, one scale per row
        assert cast.scaling_granularity is ao.ScalingGranularity.AXISWISE
        assert cast.target_dtype == fp8.get_quantizer("rowwise", role).quantize(x).data.dtype
    assert not tensorwise.round_scales_to_power_of_2 and rowwise.round_scales_to_power_of_2
    assert fp8.get_quantizer("rowwise", "input").power_2_scale  # our default is the recipe's
    for config in (tensorwise, rowwise):  # TE's split too: fast accumulation in fprop only
        assert config.gemm_config_output.use_fast_accum
        assert not config.gemm_config_grad_input.use_fast_accum
        assert not config.gemm_config_grad_weight.use_fast_accum


# ---- 1. scale from amax --------------------------------------------------------------------------
@functools.cache
def amax_sweep() -> torch.Tensor:
    """Every positive finite bfloat16 value, and 1M random positive finite float32 patterns."""
    bf16 = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    f32 = torch.randint(1, 0x7F800000, (1_000_000,), generator=g, dtype=torch.int32)
    return torch.cat([bf16.to(torch.float32), f32.view(torch.float32)])


@pytest.mark.parametrize("dtype", (torch.float8_e4m3fn, torch.float8_e5m2), ids=str)
def test_amax_to_scale_equals_te_rule_above_eps(dtype: torch.dtype) -> None:
    """torchao: ``fmax / clamp(amax, EPS)`` in float64, rounded to float32
    (float8_utils.py:44-48). TE: ``fmax / amax`` in float32. Above EPS the float64 detour
    gives the correctly rounded float32 quotient too (no double rounding anywhere in the
    sweep). Below EPS torchao divides by EPS, TE by the amax itself."""
    amax = amax_sweep()
    theirs = amax_to_scale(amax, dtype)
    ours = scale_from_amax(amax, fp8_max(dtype))
    above = amax.to(torch.float64) >= AO_EPS
    assert_same_bits(ours[above], theirs[above], "scale for amax >= EPS")
    assert bool(
        (theirs[~above] == torch.tensor(fp8_max(dtype) / AO_EPS, dtype=torch.float32)).all()
    )
    assert bool((ours[~above] > theirs[~above]).all())  # 448 / amax, up to FLT_MAX for tiny ones


def test_power_of_two_rounding_differs_just_below_a_power_of_two() -> None:
    """torchao: ``exp2(floor(log2(scale)))`` (float8_utils.py:244-246); TE: clear the mantissa
    (``scale_from_amax``). They agree unless ``torch.log2`` of a float32 scale a few ulps below
    ``2^k`` rounds to exactly ``k``: then torchao's scale is ``2^k``, twice TE's, and the largest
    element, ``amax * 2^k`` slightly above fp8 max, saturates."""
    k = torch.arange(-100, 101, dtype=torch.float64).repeat_interleave(4)
    j = torch.arange(1, 5, dtype=torch.float64).repeat(201)
    near = (448.0 * torch.exp2(-k) * (1 + j * 2.0**-23)).to(torch.float32)  # 2^k (1 - j 2^-23)
    rounded_up: dict[str, int] = {}
    for sweep, a in (("random", amax_sweep()), ("near", near)):
        a = a[a.to(torch.float64) >= AO_EPS]  # below EPS the unrounded scales differ (above)
        plain = amax_to_scale(a, torch.float8_e4m3fn)
        theirs = amax_to_scale(a, torch.float8_e4m3fn, round_scales_to_power_of_2=True)
        ours = scale_from_amax(a, 448.0, power_2=True)
        assert bool((ours <= plain).all()) and bool((ours > plain / 2).all())  # rounded down
        up = bits(ours) != bits(theirs)
        assert bool((theirs[up] == 2 * ours[up]).all()) and bool((theirs[up] > plain[up]).all())
        assert bool((torch.log2(plain[up]) == torch.log2(theirs[up])).all())  # log2 rounded to k
        rounded_up[sweep] = int(up.sum())
    assert rounded_up["near"] > 0, f"{rounded_up}: torchao no longer rounds up; update the docs"


# ---- 2. casts, bit for bit -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_current_equals_torchao_tensorwise(
    shape: tuple[int, ...], regime: str, dtype: torch.dtype
) -> None:
    x = make(shape, regime, dtype)
    for role in ROLES:
        for power_2 in (False, True):
            q = fp8.get_quantizer("current", role, power_2_scale=power_2).quantize(x)
            t = torchao_cast(x, "current", role, power_2=power_2)
            what = f"{role}, power_2={power_2}"
            scale = scale_from_amax(q.amax, fp8_max(t._data.dtype), power_2=power_2)
            if power_2 and bool(bits(scale) != bits(t._scale)):  # torchao rounded up (above)
                assert regime == "near_pow2" and t._scale == 2 * scale, what
                assert_same_bits(fp8.quantize(x, q.fmt, t._scale), t._data, f"payload ({what})")
                continue
            assert_same_bits(q.data, t._data, f"payload ({what})")
            assert_same_bits(scale, t._scale, f"scale ({what})")
            assert_same_bits(q.scale_inv, torch.reciprocal(t._scale), f"scale_inv ({what})")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rowwise_equals_torchao_axiswise(
    shape: tuple[int, ...], regime: str, dtype: torch.dtype
) -> None:
    """One scale per row (``axiswise_dim=-1``), and per column (``axiswise_dim=0``, ours on
    ``x.T``), as the backward GEMMs need; with and without power-of-two scales."""
    x = make(shape, regime, dtype)
    cases = [(x, -1)] + ([(x.T, 0)] if x.dim() == 2 else [])
    for role in ROLES:
        for power_2 in (True, False):
            for ours_in, dim in cases:
                q = fp8.get_quantizer("rowwise", role, power_2_scale=power_2).quantize(ours_in)
                t = torchao_cast(x, "rowwise", role, axiswise_dim=dim, power_2=power_2)
                data, scale = (t._data, t._scale) if dim == -1 else (t._data.T, t._scale.T)
                what = f"{role}, axiswise_dim={dim}, power_2={power_2}"
                assert_same_bits(q.data, data, f"payload ({what})")
                assert_same_bits(q.scale_inv, torch.reciprocal(scale).reshape(-1), what)


def test_rowwise_special_rows_equal_torchao() -> None:
    """A zero row gets torchao's huge finite scale, an inf or NaN row turns to NaN (and zeros):
    torchao has no special case and neither has ``RowwiseQuantizer``."""
    x = torch.randn(5, 32)
    x[1] = 0.0
    x[2, 3] = float("inf")
    x[3, 4] = float("nan")
    for dtype in DTYPES:
        q = fp8.get_quantizer("rowwise", "input").quantize(x.to(dtype))
        t = torchao_cast(x.to(dtype), "rowwise", "input")
        assert_same_bits(q.data, t._data, f"payload {dtype}")
        assert_same_bits(q.scale_inv, torch.reciprocal(t._scale).reshape(-1), f"scale_inv {dtype}")
        assert q.scale_inv[1] == 2.0**-48  # 448e12 rounded down to 2^48
        assert q.scale_inv[2] == float("inf") and q.data[2].float().isnan().sum() == 1  # scale 0
        deq = q.dequantize(torch.float32)
        assert bool(deq[2:4].isnan().all()) and bool(deq[[0, 1, 4]].isfinite().all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_current_differs_from_torchao_where_documented(dtype: torch.dtype) -> None:
    def both(x: torch.Tensor) -> tuple[QuantizedTensor, ao.Float8TrainingTensor]:
        x = x.to(dtype)
        return fp8.get_quantizer("current", "input").quantize(x), torchao_cast(
            x, "current", "input"
        )

    # all zeros: same zero payload; TE's scale 1, torchao's 448 / EPS
    q, t = both(torch.zeros(4, 16))
    assert_same_bits(q.data, t._data, "zeros")
    assert q.scale_inv == 1.0 and t._scale == torch.tensor(448.0 / AO_EPS, dtype=torch.float32)
    # amax below EPS: TE scales it up to 448, torchao's floored scale flushes it to zero
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)) * 1e-20
    q, t = both(x)
    assert q.data.float().abs().max() == 448.0 and bool((t._data.float() == 0).all())
    torch.testing.assert_close(q.dequantize(torch.float32), x.to(dtype).float(), rtol=2**-3, atol=0)
    # an inf element: TE's scale 1 (inf saturates, the rest unscaled); torchao's 448 / inf = 0
    x = torch.linspace(-3, 3, 64).reshape(4, 16)
    x[1, 2] = float("inf")
    q, t = both(x)
    assert q.scale_inv == 1.0 and q.data[1, 2].float() == 448.0
    assert t._scale == 0.0 and t._data[1, 2].float().isnan()
    assert bool((t._data.float().nan_to_num(0.0) == 0).all())
    # a NaN element: TE's amax skips it; torchao's amax is NaN, and so is every element
    x = torch.linspace(-3, 3, 64).reshape(4, 16)
    x[2, 5] = float("nan")
    q, t = both(x)
    assert bool(t._scale.isnan()) and bool(t._data.float().isnan().all())
    _, t0 = both(x.nan_to_num(0.0))  # torchao without the NaN: ours, apart from that element
    keep = ~x.isnan()
    assert_same_bits(q.data[keep], t0._data[keep], "finite elements next to a NaN")
    assert q.data[2, 5].float().isnan()


# ---- 3. the layer ----------------------------------------------------------------------------------
@pytest.fixture
def inductor_untouched() -> Iterator[None]:
    """``convert_to_float8_training`` patches inductor's Triton min/max codegen for the whole
    process (torchao/float8/_inductor_patch.py); restore it for the other tests."""
    from torch._inductor.codegen.triton import TritonOverrides

    saved = {name: TritonOverrides.__dict__[name] for name in ("minimum", "maximum")}
    yield
    for name, method in saved.items():
        setattr(TritonOverrides, name, method)


def spread(*shape: int, seed: int) -> torch.Tensor:
    """Standard normal values times a factor from 1e-6 to 1 per row and per column (shuffled):
    then scaling along the wrong axis flushes or blurs small elements in E4M3's subnormals, so a
    reference with the wrong axes fails (power-of-two scales otherwise hide the axis: rounding
    ``x * 2^k`` is rounding ``x``, scaled)."""
    g = torch.Generator().manual_seed(seed)
    rows, cols = math.prod(shape[:-1]), shape[-1]
    factors = [torch.logspace(-6, 0, n)[torch.randperm(n, generator=g)] for n in (rows, cols)]
    x = torch.randn(rows, cols, generator=g) * factors[0][:, None] * factors[1]
    return x.reshape(shape)


def run_torchao_mlp(
    recipe: str, dtype: torch.dtype, emulate: bool
) -> list[dict[str, torch.Tensor]]:
    """Forward and backward of a converted 64 -> 48 -> 32 MLP (x: 2 x 16 x 64); per Linear,
    what it saw (input, grad_output, weight) and what torchao computed."""
    torch.manual_seed(0)
    # No bias: it would drown the small rows that tell the scaling axes apart (``spread``).
    model = nn.Sequential(nn.Linear(64, 48, bias=False), nn.ReLU(), nn.Linear(48, 32, bias=False))
    model = model.to(dtype)
    config = dataclasses.replace(
        ao.Float8LinearConfig.from_recipe_name(RECIPES[recipe]), emulate=emulate
    )
    ao.convert_to_float8_training(model, config=config)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert all(type(m).__name__ == "Float8Linear" for m in linears)
    seen: list[dict[str, torch.Tensor]] = [{} for _ in linears]
    for layer, record in zip(linears, seen, strict=True):
        layer.register_forward_hook(
            lambda m, i, o, r=record: r.update(x=i[0].detach(), out=o.detach())
        )
        layer.register_full_backward_hook(
            lambda m, gi, go, r=record: r.update(go=go[0].detach(), grad_input=gi[0].detach())
        )
    x = spread(2, 16, 64, seed=1).to(dtype).requires_grad_()
    y = model(x)
    y.backward(spread(*y.shape, seed=2).to(dtype))
    for layer, record in zip(linears, seen, strict=True):
        record.update(w=layer.weight.detach(), grad_weight=layer.weight.grad)
    return seen


def reference_gemms(
    recipe: str, seen: dict[str, torch.Tensor], along_reduction: bool = True
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The three GEMMs ``a @ b`` of one Linear from our quantizers, dequantized to float32.

    torchao (``matmul_with_hp_or_float8_args``) scales every operand along the GEMM's reduction
    dimension, ``a`` per row and ``b`` per column, as rowwise ``torch._scaled_mm`` requires:
        out         = x (M, K)    @ w^T (K, N)   x: axiswise_dim -1, w^T: 0
        grad_input  = go (M, N)   @ w (N, K)     go: -1, w^T: -1 (then transposed)
        grad_weight = go^T (N, M) @ x (M, K)     go: 0 (then transposed), x: 0
    For current scaling the axes do not matter (one scale per tensor). ``along_reduction=False``
    scales the other way: a negative control."""

    def deq(role: str, t: torch.Tensor) -> torch.Tensor:
        return fp8.get_quantizer(recipe, role).quantize(t).dequantize(torch.float32)

    def operands(roles: tuple[str, str], a: torch.Tensor, b: torch.Tensor) -> tuple:
        if along_reduction:
            return deq(roles[0], a), deq(roles[1], b.T).T
        return deq(roles[0], a.T).T, deq(roles[1], b)

    x, go, w = seen["x"].flatten(0, -2), seen["go"].flatten(0, -2), seen["w"]
    return {
        "out": operands(("input", "weight"), x, w.T),
        "grad_input": operands(("grad_output", "weight"), go, w),
        "grad_weight": operands(("grad_output", "input"), go.T, x),
    }


def gemm_tolerance(a: torch.Tensor, b: torch.Tensor, via_bf16: bool) -> torch.Tensor:
    """Per element, how far two float32 GEMMs of the same FP8 operands may lie apart.

    Summation in any order errs by at most K u sum_k |a_k b_k| (u = 2^-24), so two orders differ
    by 2 K u |a| @ |b|; 8 u more covers dequantizing by dividing by the scale (torchao) instead of
    multiplying by its float32 reciprocal (ours, and the scales torchao hands torch._scaled_mm).
    A result rounded to bfloat16 (bf16 models; and torch._scaled_mm's rowwise output, which
    torchao requests in bf16 even for fp32 models, float8_ops.py:61-66) may then flip to the
    neighbouring bf16 value: 2^-7 of its magnitude. Far below FP8's own error (2^-4 per element),
    so another recipe's scales, or the wrong axes, fail (the test checks both controls).
    """
    mag = a.abs().double() @ b.abs().double()
    tol = (2 * a.shape[1] + 8) * U * mag
    return tol + 2.0**-7 * (a.double() @ b.double()).abs() if via_bf16 else tol


def layer_result(
    gemm: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype, via_bf16: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """What torchao's layer should return for one GEMM, in the model's dtype, and the bound."""
    a, b = gemm
    return (a @ b).to(dtype), gemm_tolerance(a, b, via_bf16 or dtype == torch.bfloat16)


def within(got: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor) -> tuple[bool, float]:
    err = (got.double() - ref.double()).abs()
    return bool((err <= tol).all()), float((err / tol.clamp_min(1e-300)).max())


@pytest.mark.parametrize(
    "emulate",
    (True, pytest.param(False, marks=pytest.mark.cpu_scaled_mm)),
    ids=("emulate", "scaled_mm"),
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("recipe", RECIPES)
def test_torchao_float8_linear_matches_our_quantizers(
    recipe: str, dtype: torch.dtype, emulate: bool, inductor_untouched: None
) -> None:
    via_bf16 = recipe == "rowwise" and not emulate  # fp32 models too (gemm_tolerance)
    controls = {"other recipe": ("rowwise" if recipe == "current" else "current", True)}
    if recipe == "rowwise":
        controls["wrong axes"] = (recipe, False)
    for i, seen in enumerate(run_torchao_mlp(recipe, dtype, emulate)):
        for name, gemm in reference_gemms(recipe, seen).items():
            got = seen[name].reshape(gemm[0].shape[0], gemm[1].shape[1])
            ok, worst = within(got, *layer_result(gemm, dtype, via_bf16))
            assert ok, f"layer {i} {name}: error up to {worst:.3g}x the bound"
            for control, (r, along) in controls.items():
                wrong = reference_gemms(r, seen, along_reduction=along)[name]
                ok, _ = within(got, *layer_result(wrong, dtype, via_bf16))
                assert not ok, f"layer {i} {name}: the {control} passed too; the test is blind"
