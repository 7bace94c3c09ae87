"""GEMM accumulation as a recipe setting (issue 17, section 1): TE's delayed-scaling defaults
(fast accumulation forward, split for dgrad and wgrad) reach ``torch._scaled_mm``'s
``use_fast_accum``; the CPU emulation ignores the flag under ``accumulation="exact"``. Nothing
here runs ``_scaled_mm``. Under ``accumulation="hopper"`` (issue 35) the emulation sums as
Hopper's tensor cores do (``fp8.mma``, checked bit for bit in ``test_fp8_mma.py``): a layer's
three GEMMs equal ``mma_accumulate`` by hand, for every recipe Hopper runs; MXFP8 and NVFP4 warn
and keep float32 sums; the CLI's ``--fp8-accumulation`` trains every FP8 precision, records the
setting in the checkpoint, and is refused elsewhere."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tutorial_lib.__main__ import main
from tutorial_lib.checkpoint import load_checkpoint
from tutorial_lib.fp8 import (
    E4M3,
    DelayedScaling,
    autocast,
    gemm,
    linear_function,
    mma_accumulate,
    quantize,
    scaled_gemm,
)
from tutorial_lib.fp8.gemm import emulated_gemm
from tutorial_lib.fp8.linear import FP8Linear
from tutorial_lib.fp8.mma import mma_block_scaled
from tutorial_lib.fp8.policy import FP8_RECIPE_POLICIES, HOPPER_ACCUMULATION, fp8_policy_name
from tutorial_lib.fp8.quantizers import QuantizedTensor
from tutorial_lib.fp8.recipes import (
    Float8BlockScaling,
    Float8CurrentScaling,
    Float8RowwiseScaling,
    Recipe,
    make_recipe,
)
from tutorial_lib.fp8.scaling import MMParams
from tutorial_lib.fp8.te_policy import TE_DELAYED_SPLIT_ACCUMULATOR, te_recipe_kwargs
from tutorial_lib.precision import available_policies, get_policy


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


# ---- accumulation="hopper" (issue 35) ----------------------------------------------------------
@dataclass
class LayerStep:
    """One SGD step (lr 0.5) of an FP8Linear(256, in 160 out) on 192 tokens in float32, no
    autocast: every GEMM has K > 128, so fast and split accumulation differ."""

    w0: torch.Tensor  # the weight and bias before the step
    b0: torch.Tensor
    x: torch.Tensor
    dy: torch.Tensor
    out: torch.Tensor  # the layer's output, input gradient and weight after the step
    dx: torch.Tensor
    w1: torch.Tensor


def _layer_step(recipe: Recipe, seed: int = 0) -> LayerStep:
    torch.manual_seed(seed)
    layer = FP8Linear(256, 160, amax_history_len=4)
    assert layer.bias is not None
    w0, b0 = layer.weight.detach().clone(), layer.bias.detach().clone()
    x = (torch.randn(192, 256) * 3).requires_grad_(True)
    dy = torch.randn(192, 160)
    with autocast(recipe=recipe):
        out = layer(x)
    out.backward(dy)
    torch.optim.SGD(layer.parameters(), lr=0.5).step()
    assert x.grad is not None
    return LayerStep(w0, b0, x.detach(), dy, out.detach(), x.grad, layer.weight.detach())


def _by_hand(a: QuantizedTensor, b: QuantizedTensor, fast: bool) -> torch.Tensor:
    """A per-tensor GEMM as the emulation does it: the accumulator times both scale inverses."""
    return mma_accumulate(a.data, b.data, fast_accum=fast) * (a.scale_inv * b.scale_inv)


def test_a_hopper_training_step_is_mma_accumulate_by_hand() -> None:
    """Current scaling: forward with fast accumulation, dgrad and wgrad split (TE's defaults),
    each GEMM ``mma_accumulate``'s float32 accumulator times the scale inverses; and it trains
    otherwise than float32 sums do."""
    recipe = Float8CurrentScaling(accumulation="hopper")
    step, q = _layer_step(recipe), recipe.quantizer
    x, dy, w0 = step.x, step.dy, step.w0
    out = _by_hand(q("input").quantize(x), q("weight").quantize(w0), True) + step.b0
    dx = _by_hand(q("grad_output").quantize(dy), q("weight", True).quantize(w0.t()), False)
    dw = _by_hand(q("grad_output", True).quantize(dy.t()), q("input", True).quantize(x.t()), False)
    assert torch.equal(step.out, out) and torch.equal(step.dx, dx)
    assert torch.equal(step.w1, w0 - 0.5 * dw)  # the SGD step
    exact = _layer_step(Float8CurrentScaling())
    for name in ("out", "dx", "w1"):
        assert not torch.equal(getattr(exact, name), getattr(step, name)), name


def test_row_wise_scales_multiply_the_hopper_accumulator() -> None:
    recipe = Float8RowwiseScaling(accumulation="hopper")
    step = _layer_step(recipe)
    xq = recipe.quantizer("input").quantize(step.x)
    wq = recipe.quantizer("weight").quantize(step.w0)
    sums = mma_accumulate(xq.data, wq.data, fast_accum=True)
    want = sums * (xq.scale_inv.reshape(-1, 1) * wq.scale_inv.reshape(1, -1)) + step.b0
    assert torch.equal(step.out, want)


def test_block_recipe_scales_each_128_tile_of_the_hopper_sums() -> None:
    """The block recipe's GEMMs: every 128-wide K tile's chain times its two tile scales, added
    in float32 (``mma_block_scaled``); the weight's 128 x 128 tiles give each row its scale."""
    recipe = Float8BlockScaling(accumulation="hopper")
    step = _layer_step(recipe)
    xq = recipe.quantizer("input").quantize(step.x)  # 1 x 128 tiles: (192, 2) scales
    wq = recipe.quantizer("weight").quantize(step.w0)  # 128 x 128 tiles: (2, 2)
    w_scales = wq.scale_inv.repeat_interleave(128, dim=0)[:160]
    want = mma_block_scaled(xq.data, xq.scale_inv, wq.data, w_scales) + step.b0
    assert torch.equal(step.out, want)
    assert not torch.equal(_layer_step(Float8BlockScaling()).out, step.out)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_recipes_hopper_cannot_run_keep_float32_sums_and_say_so(
    monkeypatch: pytest.MonkeyPatch, recipe: str
) -> None:
    monkeypatch.setattr(gemm, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match=f"{recipe}: Hopper has no tensor cores"):
        hopper = _layer_step(make_recipe(recipe, accumulation="hopper"))
    exact = _layer_step(make_recipe(recipe))
    assert torch.equal(hopper.out, exact.out) and torch.equal(hopper.w1, exact.w1)


def test_a_gpu_runs_its_own_accumulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA (faked) the GEMM goes to ``torch._scaled_mm`` with the recipe's flag whatever
    the accumulation: the tensor cores sum as they do."""
    calls: list[bool] = []

    def fake_scaled_mm(a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        calls.append(kwargs["use_fast_accum"])
        return emulated_gemm(a, kwargs["scale_a"], b, kwargs["scale_b"], None, kwargs["out_dtype"])

    monkeypatch.setattr(gemm, "_is_cuda", lambda t: True)
    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    a = quantize(torch.randn(32, 256), E4M3, torch.tensor(2.0))
    b = quantize(torch.randn(256, 16), E4M3, torch.tensor(4.0))
    one = torch.tensor(1.0)
    got = scaled_gemm(a, one, b, one, use_fast_accum=True, accumulation="hopper")
    assert calls == [True] and torch.equal(got, emulated_gemm(a, one, b, one))


def test_accumulation_is_checked() -> None:
    with pytest.raises(ValueError, match="accumulation='fast'.*'exact'.*'hopper'"):
        DelayedScaling(accumulation="fast")
    assert make_recipe("block", accumulation="hopper").accumulation == "hopper"
    assert Float8CurrentScaling().accumulation == "exact"  # the default: float32 sums


# ---- the policies and the CLI ------------------------------------------------------------------
def test_hopper_policies_are_variants_found_by_name() -> None:
    """``<fp8 precision>+hopper-acc``: registered on first use, never listed (a table over every
    precision lists each once)."""
    for precision in FP8_RECIPE_POLICIES:
        name = fp8_policy_name(precision, "hopper")
        assert name == precision + HOPPER_ACCUMULATION
        assert get_policy(name).name == name and name not in available_policies()
        assert fp8_policy_name(name, "exact") == precision
    with pytest.raises(ValueError, match=r"'bf16' has no FP8 GEMMs.*fp8, fp8-current"):
        fp8_policy_name("bf16", "hopper")


def _train(out: Path, data: Path, *extra: str) -> list[str]:
    return [
        "train", "--preset", "ci", "--steps", "1", "--batch-size", "2", "--data", str(data),
        "--out", str(out), "--device", "cpu", "--no-progress", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("precision", list(FP8_RECIPE_POLICIES))
def test_cli_trains_every_fp8_precision_with_hopper_accumulation(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str], precision: str
) -> None:
    out = tmp_path / "run"
    argv = _train(out, text_file, "--precision", precision, "--fp8-accumulation", "hopper")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # MXFP8 and NVFP4 say they sum in FP32
        assert main(argv) == 0, capsys.readouterr().err
    state = load_checkpoint(out / "checkpoint.pt")
    name = precision + HOPPER_ACCUMULATION
    assert state["train_config"]["precision"] == state["model_recipe"]["precision"] == name


def test_cli_resumes_only_with_the_recorded_accumulation(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(_train(out, text_file, "--precision", "fp8", "--fp8-accumulation", "hopper")) == 0
    again = _train(out, text_file, "--precision", "fp8", "--resume")
    again[again.index("--steps") + 1] = "2"
    assert main(again) == 1
    assert "trained in precision 'fp8+hopper-acc'" in capsys.readouterr().err
    assert main([*again, "--fp8-accumulation", "hopper"]) == 0
    assert load_checkpoint(out / "checkpoint.pt")["step"] == 2


@pytest.mark.parametrize("precision", ["bf16", "te-fp8"])
def test_cli_refuses_fp8_accumulation_without_our_fp8_gemms(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str], precision: str
) -> None:
    out = tmp_path / "run"
    argv = _train(out, text_file, "--precision", precision, "--fp8-accumulation", "hopper")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --fp8-accumulation") and len(err.strip().splitlines()) == 1
    assert "fp8, fp8-current" in err and not out.exists()  # refused before the folder
