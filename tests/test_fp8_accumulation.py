"""GEMM accumulation as a recipe setting (issue 17, section 1): TE's delayed-scaling defaults
(fast accumulation forward, split for dgrad and wgrad) reach ``torch._scaled_mm``'s
``use_fast_accum``; the CPU emulation ignores the flag. Nothing here runs ``_scaled_mm``."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tutorial_lib.fp8 import (
    E4M3,
    DelayedScaling,
    autocast,
    gemm,
    linear_function,
    quantize,
    scaled_gemm,
)
from tutorial_lib.fp8.gemm import emulated_gemm
from tutorial_lib.fp8.linear import FP8Linear
from tutorial_lib.fp8.recipes import (
    Float8BlockScaling,
    Float8CurrentScaling,
    Float8RowwiseScaling,
    Recipe,
)
from tutorial_lib.fp8.scaling import MMParams
from tutorial_lib.fp8.te_policy import TE_DELAYED_SPLIT_ACCUMULATOR, te_recipe_kwargs


def test_recipe_defaults_are_te_delayed_scaling_accumulation() -> None:
    recipe = DelayedScaling()
    assert recipe.fp8_gemm_fprop == MMParams(use_split_accumulator=False)
    assert recipe.fp8_gemm_dgrad == recipe.fp8_gemm_wgrad == MMParams(use_split_accumulator=True)
    assert recipe.fp8_gemm_fprop.use_fast_accum and not recipe.fp8_gemm_dgrad.use_fast_accum
    with pytest.raises(TypeError, match="fp8_gemm_dgrad must be an MMParams"):
        DelayedScaling(fp8_gemm_dgrad=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a bool"):
        MMParams(use_split_accumulator=1)  # type: ignore[arg-type]


def _spy_gemms(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, ...], bool]]:
    """Record (output shape, use_fast_accum) of every GEMM FP8Linear runs; compute it with the
    real function (the CPU emulation)."""
    seen: list[tuple[tuple[int, ...], bool]] = []
    signature = inspect.signature(scaled_gemm)

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        out = scaled_gemm(*args, **kwargs)
        seen.append((tuple(out.shape), bound.arguments["use_fast_accum"]))
        return out

    monkeypatch.setattr(linear_function, "scaled_gemm", spy)
    return seen


@pytest.mark.parametrize(
    ("recipe", "fprop", "dgrad", "wgrad"),
    [
        (DelayedScaling(amax_history_len=4), True, False, False),  # TE's delayed scaling
        (
            DelayedScaling(
                amax_history_len=4,
                fp8_gemm_fprop=MMParams(use_split_accumulator=True),
                fp8_gemm_wgrad=MMParams(use_split_accumulator=False),
            ),
            False,
            False,
            True,
        ),
    ],
    ids=["te-defaults", "override"],
)
def test_fp8linear_passes_the_recipe_accumulation_to_each_gemm(
    monkeypatch: pytest.MonkeyPatch, recipe: DelayedScaling, fprop: bool, dgrad: bool, wgrad: bool
) -> None:
    seen = _spy_gemms(monkeypatch)
    layer = FP8Linear(48, 32, amax_history_len=4)
    x = torch.randn(16, 48, requires_grad=True)
    with autocast(recipe=recipe):
        out = layer(x)
    out.sum().backward()
    # forward y (16, 32), dgrad dx (16, 48), wgrad dW (32, 48)
    assert seen == [((16, 32), fprop), ((16, 48), dgrad), ((32, 48), wgrad)]


def test_scaled_gemm_gives_scaled_mm_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path (forced here on CPU tensors) passes ``use_fast_accum`` to a stand-in for
    ``torch._scaled_mm``; the emulation path takes the flag and ignores it."""
    calls: list[dict[str, Any]] = []

    def fake_scaled_mm(a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        calls.append(kwargs)
        return emulated_gemm(a, kwargs["scale_a"], b, kwargs["scale_b"], None, kwargs["out_dtype"])

    g = torch.Generator().manual_seed(0)
    a = quantize(torch.randn(32, 48, generator=g), E4M3, torch.tensor(2.0))
    b = quantize(torch.randn(48, 16, generator=g), E4M3, torch.tensor(4.0))
    inv = torch.tensor(0.5), torch.tensor(0.25)
    want = emulated_gemm(a, inv[0], b, inv[1])
    for fast in (True, False):  # emulation: same result, whatever the flag
        assert torch.equal(scaled_gemm(a, inv[0], b, inv[1], use_fast_accum=fast), want)
    monkeypatch.setattr(gemm, "_is_cuda", lambda t: True)
    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    for fast in (True, False):
        scaled_gemm(a, inv[0], b, inv[1], use_fast_accum=fast)
    scaled_gemm(a, inv[0], b, inv[1])
    assert [c["use_fast_accum"] for c in calls] == [True, False, False]  # default: split
    assert all(c["out_dtype"] == torch.float32 for c in calls)  # per-tensor: as asked
    rows, cols = torch.rand(32, 1) + 0.5, torch.rand(1, 16) + 0.5  # row-wise scales: BF16 out
    got = scaled_gemm(a, rows, b, cols)
    assert calls[-1]["out_dtype"] == torch.bfloat16 and got.dtype == torch.float32


def test_a_gpu_gemm_off_the_16_grid_warns_once_and_emulates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gemm, "_is_cuda", lambda t: True)
    monkeypatch.setattr(gemm, "_WARNED", set())
    monkeypatch.setattr(torch, "_scaled_mm", None)  # must not be called
    g = torch.Generator().manual_seed(1)
    a = quantize(torch.randn(24, 48, generator=g), E4M3, torch.tensor(2.0))  # 24: not 16k
    b = quantize(torch.randn(48, 16, generator=g), E4M3, torch.tensor(4.0))
    inv = torch.tensor(0.5), torch.tensor(0.25)
    with pytest.warns(RuntimeWarning, match=r"\(24, 48\) x \(48, 16\).*multiple of 16"):
        got = scaled_gemm(a, inv[0], b, inv[1])
    assert torch.equal(got, emulated_gemm(a, inv[0], b, inv[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call is silent
        scaled_gemm(a, inv[0], b, inv[1])


def test_te_policy_refuses_an_accumulation_te_cannot_express() -> None:
    assert "fp8_gemm_fprop" not in te_recipe_kwargs(DelayedScaling())  # TE's defaults: accepted
    odd = DelayedScaling(fp8_gemm_fprop=MMParams(use_split_accumulator=True))
    with pytest.raises(ValueError, match="fp8_gemm_fprop.*TE's DelayedScaling fixes"):
        te_recipe_kwargs(odd)


def test_te_source_fixes_the_delayed_scaling_accumulation(
    te_source: Callable[[str, str], str],
) -> None:
    """The defaults mirror TE's module constants (``pytorch/module/base.py``) in both TE
    versions the contract test pins."""
    for version in ("2.9.0", "2.20.2"):
        source = te_source(version, "pytorch/module/base.py")
        want = TE_DELAYED_SPLIT_ACCUMULATOR
        for gemm_name, constant in (("fprop", "FPROP"), ("dgrad", "DGRAD"), ("wgrad", "WGRAD")):
            split = want[f"fp8_gemm_{gemm_name}"]
            assert f"_2X_ACC_{constant} = {split}" in source, (version, constant)
            assert getattr(DelayedScaling(), f"fp8_gemm_{gemm_name}").use_split_accumulator is split


@pytest.mark.parametrize(
    ("recipe", "flags"),
    [
        (Float8CurrentScaling(), [True, False, False]),  # TE's defaults: fast forward only
        (Float8RowwiseScaling(), [True, False, False]),
        (
            Float8CurrentScaling(
                fp8_gemm_fprop=MMParams(use_split_accumulator=True),
                fp8_gemm_dgrad=MMParams(use_split_accumulator=False),
            ),
            [False, True, False],
        ),
        (Float8BlockScaling(), [False, False, False]),  # split everywhere (TE's block default)
    ],
    ids=["current", "rowwise", "current-override", "block"],
)
def test_stateless_recipes_pass_their_accumulation_to_each_gemm(
    monkeypatch: pytest.MonkeyPatch, recipe: Recipe, flags: list[bool]
) -> None:
    """Forward, dgrad and wgrad of a recipe layer reach ``quantized_matmul`` with the recipe's
    ``use_fast_accum``, in that order (the CUDA path hands it to ``torch._scaled_mm``)."""
    seen: list[tuple[tuple[int, ...], bool]] = []
    real = linear_function.quantized_matmul

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(*args, **kwargs)
        fast = kwargs.get("use_fast_accum", args[4] if len(args) > 4 else False)
        seen.append((tuple(out.shape), fast))
        return out

    monkeypatch.setattr(linear_function, "quantized_matmul", spy)
    layer = FP8Linear(48, 32, amax_history_len=4)
    x = torch.randn(16, 48, requires_grad=True)
    with autocast(recipe=recipe):
        out = layer(x)
    out.sum().backward()
    # forward y (16, 32), dgrad dx (16, 48), wgrad dW (32, 48)
    shapes = [(16, 32), (16, 48), (32, 48)]
    assert seen == list(zip(shapes, flags, strict=True))
