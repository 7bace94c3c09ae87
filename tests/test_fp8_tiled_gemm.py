"""The block recipe's native GEMM (``fp8.tiled_gemm``) against a fake of torch's blockwise kernel.

A CPU has no blockwise kernel, so ``fake_scaled_mm`` stands in for
``torch.nn.functional.scaled_mm``: it applies the checks torch's CUDA kernel makes on the operands
and scales (``aten/src/ATen/native/cuda/ScaledBlas.cpp``: dtypes, shapes, strides, the padding of
128x128 scales) and reads the scales the way that kernel's layout defines, then multiplies in
float64. A scale put in the wrong place, a wrong padding or a wrong stride fails here.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tutorial_lib.fp8 import gemm
from tutorial_lib.fp8.linear_function import FP8LinearFunction, RecipeOperands, quantized_matmul
from tutorial_lib.fp8.native import check_recipe_device
from tutorial_lib.fp8.recipes import Float8BlockScaling
from tutorial_lib.fp8.scaling import Format
from tutorial_lib.fp8.tiled_gemm import block_scale_operand, native_block_problem

if not hasattr(torch.nn.functional, "ScalingType"):  # the pinned torch 2.13 has it
    pytest.skip("torch.nn.functional.ScalingType needs torch 2.10+", allow_module_level=True)
ScalingType = torch.nn.functional.ScalingType


def _expanded(scale: torch.Tensor, recipe: ScalingType, rows: int, k: int) -> torch.Tensor:
    """The (rows, k) per-element scales the kernel reads from ``scale``, after its checks."""
    k_tiles = math.ceil(k / 128)
    assert scale.dtype == torch.float32
    if recipe == ScalingType.BlockWise1x128:
        assert tuple(scale.shape) == (rows, k_tiles), scale.shape
        assert scale.stride(0) == 1 and (scale.stride(1) == rows or k_tiles == 1), scale.stride()
        grid = scale
        return grid.repeat_interleave(128, 1)[:, :k]
    assert recipe == ScalingType.BlockWise128x128
    padded_k = 4 * math.ceil(k_tiles / 4)
    assert tuple(scale.shape) == (padded_k, math.ceil(rows / 128)), scale.shape
    assert scale.stride() == (1, padded_k), scale.stride()
    grid = scale[:k_tiles].t()  # (row tiles, K tiles); the padding is not read
    return grid.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :k]


class FakeBlockwiseKernel:
    """``torch.nn.functional.scaled_mm`` for the blockwise recipes, on a CPU, in float64."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        mat_a: torch.Tensor,
        mat_b: torch.Tensor,
        scale_a: torch.Tensor,
        recipe_a: ScalingType,
        scale_b: torch.Tensor,
        recipe_b: ScalingType,
        swizzle_a: object = None,
        swizzle_b: object = None,
        bias: torch.Tensor | None = None,
        output_dtype: torch.dtype = torch.bfloat16,
        contraction_dim: tuple[int, ...] = (),
        use_fast_accum: bool = False,
    ) -> torch.Tensor:
        assert mat_a.dtype == mat_b.dtype == torch.float8_e4m3fn  # check_deepseek_recipe
        assert {recipe_a, recipe_b} != {ScalingType.BlockWise128x128}
        (m, k), (k_b, n) = mat_a.shape, mat_b.shape
        assert k == k_b and mat_a.stride(1) == 1 and mat_b.stride(0) == 1  # row x column major
        a = mat_a.double() * _expanded(scale_a, recipe_a, m, k).double()
        b = mat_b.t().double() * _expanded(scale_b, recipe_b, n, k).double()
        out = a @ b.t()
        if bias is not None:
            assert output_dtype in (torch.bfloat16, torch.float16) and bias.dtype == output_dtype
            out = out + bias.double()
        self.calls.append(
            {"recipes": (recipe_a, recipe_b), "bias": bias is not None, "fast": use_fast_accum}
        )
        return out.to(output_dtype)


@pytest.fixture
def fake_kernel(monkeypatch: pytest.MonkeyPatch) -> FakeBlockwiseKernel:
    kernel = FakeBlockwiseKernel()
    monkeypatch.setattr(gemm, "_is_cuda", lambda t: True)
    monkeypatch.setattr(gemm, "_WARNED", set())
    monkeypatch.setattr(torch.nn.functional, "scaled_mm", kernel)
    return kernel


def _tiled_magnitudes(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random values whose magnitude changes from one 128-element run to the next by up to
    10^3, so every tile gets its own scale and a misplaced scale shows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    exponents = torch.randint(-3, 1, (rows, math.ceil(cols / 128)), generator=g).float()
    return x * (10.0**exponents).repeat_interleave(128, 1)[:, :cols]


@pytest.mark.parametrize("m,k,n", [(256, 384, 128), (128, 512, 384), (128, 128, 128)])
def test_the_native_block_gemm_matches_the_emulation_in_all_three_gemms(
    fake_kernel: FakeBlockwiseKernel, m: int, k: int, n: int
) -> None:
    """Forward (1x128 x 128x128), dgrad (1x128 x 128x128 of the transposed weight) and wgrad
    (1x128 x 1x128) through torch's kernel layouts give the emulation's results; K tiles of 3,
    4 and 1 in the forward GEMM (3 and 1 padded to 4), other counts in the backward ones."""
    recipe = Float8BlockScaling()
    x = _tiled_magnitudes(m, k, 0).requires_grad_()
    w = _tiled_magnitudes(n, k, 1).requires_grad_()
    bias = torch.randn(n, requires_grad=True)
    dy = _tiled_magnitudes(m, n, 2)
    results = []
    for emulate in (True, False):
        args = (RecipeOperands(recipe), torch.float32, emulate, True)
        y = FP8LinearFunction.apply(x, w, bias, *args)
        dx, dw, db = torch.autograd.grad(y, (x, w, bias), dy)
        results.append((y, dx, dw, db))
    assert [c["recipes"] for c in fake_kernel.calls] == [
        (ScalingType.BlockWise1x128, ScalingType.BlockWise128x128),  # forward
        (ScalingType.BlockWise1x128, ScalingType.BlockWise128x128),  # dgrad
        (ScalingType.BlockWise1x128, ScalingType.BlockWise1x128),  # wgrad
    ]
    assert not any(c["fast"] for c in fake_kernel.calls)  # block scaling: split accumulation
    for emulated, native in zip(*results, strict=True):
        # float32 sums (emulation) against float64 (the fake): a few float32 ulps of the sum
        atol = 2e-5 * float(emulated.detach().abs().max())
        torch.testing.assert_close(native.detach(), emulated.detach(), rtol=2e-5, atol=atol)


def test_a_bf16_output_fuses_the_bias_and_float32_adds_it_after(
    fake_kernel: FakeBlockwiseKernel,
) -> None:
    q_in, q_w = Float8BlockScaling().quantizer("input"), Float8BlockScaling().quantizer("weight")
    a = q_in.quantize(_tiled_magnitudes(128, 256, 3))
    b = q_w.quantize(_tiled_magnitudes(256, 256, 4))
    bias = torch.randn(256)
    for dtype in (torch.bfloat16, torch.float32):
        native = quantized_matmul(a, b, dtype, emulate=False, bias=bias)
        emulated = quantized_matmul(a, b, dtype, emulate=True, bias=bias)
        assert native.dtype == dtype
        if dtype == torch.float32:
            torch.testing.assert_close(native, emulated, rtol=2e-5, atol=1e-4)
        else:  # the kernel adds the bias cast to BF16: one rounding more than the emulation
            torch.testing.assert_close(native.float(), emulated.float(), rtol=1e-2, atol=1e-2)
    assert [c["bias"] for c in fake_kernel.calls] == [True, False]


def test_a_gemm_the_kernel_cannot_take_warns_once_and_emulates(
    fake_kernel: FakeBlockwiseKernel,
) -> None:
    recipe = Float8BlockScaling()
    a = recipe.quantizer("input").quantize(torch.randn(24, 256))  # 24 rows: not 128k
    b = recipe.quantizer("weight").quantize(torch.randn(128, 256))
    assert "multiple of 128" in str(native_block_problem(a, b))
    with pytest.warns(RuntimeWarning, match=r"\(24, 256\) x \(128, 256\).*multiple of 128"):
        got = quantized_matmul(a, b, torch.float32, emulate=False)
    assert torch.equal(got, quantized_matmul(a, b, torch.float32, emulate=True))
    assert fake_kernel.calls == []
    e5m2 = (
        Float8BlockScaling(fp8_format=Format.HYBRID)
        .quantizer("grad_output")
        .quantize(torch.randn(128, 256))
    )
    assert "E4M3 operands only" in str(native_block_problem(e5m2, b))


def test_block_scale_operand_layouts() -> None:
    one_d = block_scale_operand(torch.arange(6.0).reshape(3, 2), (1, 128))
    assert one_d.shape == (3, 2) and one_d.stride() == (1, 3)
    assert torch.equal(one_d, torch.arange(6.0).reshape(3, 2))
    two_d = block_scale_operand(torch.arange(10.0).reshape(2, 5), (128, 128))  # 5 K tiles -> 8
    assert two_d.shape == (8, 2) and two_d.stride() == (1, 8)
    assert torch.equal(two_d[:5], torch.arange(10.0).reshape(2, 5).t())
    with pytest.raises(ValueError, match=r"tile \(1, 32\)"):
        block_scale_operand(torch.ones(2, 2), (1, 32))


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, cc: tuple[int, int], cuda: str | None) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", cuda)


def test_block_runs_natively_on_hopper_with_cuda_12_9_and_e4m3_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_gpu(monkeypatch, (9, 0), "12.9")
    assert check_recipe_device(Float8BlockScaling(), "cuda", None) is False  # native
    scaled_mm = torch.nn.functional.scaled_mm
    monkeypatch.delattr(torch.nn.functional, "scaled_mm")  # an older torch
    with pytest.raises(RuntimeError, match=r"has no torch.nn.functional.scaled_mm"):
        check_recipe_device(Float8BlockScaling(), "cuda", None)
    monkeypatch.setattr(torch.nn.functional, "scaled_mm", scaled_mm, raising=False)
    assert check_recipe_device(Float8BlockScaling(), "cuda", True) is True  # asked to emulate
    with pytest.raises(RuntimeError, match=r"E4M3 operands only.*emulate=True.*te-fp8"):
        check_recipe_device(Float8BlockScaling(fp8_format=Format.HYBRID), "cuda", None)
    _fake_gpu(monkeypatch, (9, 0), "12.4")
    with pytest.raises(RuntimeError, match=r"built with CUDA 12\.4.*needs 12\.9\+"):
        check_recipe_device(Float8BlockScaling(), "cuda", None)
    _fake_gpu(monkeypatch, (10, 0), "13.0")
    with pytest.raises(RuntimeError, match=r"has the math.*Hopper's only.*te-fp8"):
        check_recipe_device(Float8BlockScaling(), "cuda", None)
    _fake_gpu(monkeypatch, (8, 9), "13.0")
    with pytest.raises(RuntimeError, match=r"needs Hopper \(sm_90\)"):
        check_recipe_device(Float8BlockScaling(), "cuda", None)
