"""FP8Linear: nn.Linear outside FP8, FP8 GEMMs against a float64 reference inside, shapes, devices,
state dicts and statistics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tutorial_lib.fp8 import (
    E4M3,
    E5M2,
    DelayedScaling,
    autocast,
    convert_to_fp8,
    dequantize,
    quantize,
    scaled_gemm,
)
from tutorial_lib.fp8.gemm import emulated_gemm
from tutorial_lib.fp8.linear import FP8Linear
from tutorial_lib.fp8.native import check_recipe_device
from tutorial_lib.fp8.scaling import Format

RECIPE = DelayedScaling(amax_history_len=4)


def _layer(seed: int = 0, n_in: int = 48, n_out: int = 80, **kwargs: object) -> FP8Linear:
    torch.manual_seed(seed)
    layer = FP8Linear(n_in, n_out, amax_history_len=4, **kwargs)
    with torch.no_grad():  # non-trivial scales (not powers of two), as after some steps
        layer.fp8_scale_fwd.copy_(torch.tensor([37.3, 1234.5, 1.0]))
        layer.fp8_scale_inv_fwd.copy_(1 / layer.fp8_scale_fwd)
        layer.fp8_scale_bwd.copy_(torch.tensor([3.1e3, 1.0]))
        layer.fp8_scale_inv_bwd.copy_(1 / layer.fp8_scale_bwd)
    return layer


def _deq64(x: torch.Tensor, fmt: object, scale: torch.Tensor) -> torch.Tensor:
    return dequantize(quantize(x, fmt, scale), 1 / scale, torch.float64)


# ---- outside FP8: exactly nn.Linear -----------------------------------------------------------
def test_same_parameters_init_and_outputs_as_nn_linear() -> None:
    torch.manual_seed(1)
    ref = nn.Linear(48, 80)
    torch.manual_seed(1)
    layer = FP8Linear(48, 80)
    assert torch.equal(layer.weight, ref.weight) and torch.equal(layer.bias, ref.bias)
    x = torch.randn(3, 8, 48)
    assert torch.equal(layer(x), ref(x))
    with autocast(enabled=False):
        assert torch.equal(layer(x), ref(x))
    layer.load_state_dict(ref.state_dict())  # a plain Linear state dict loads strictly


# ---- forward and backward against float64 ----------------------------------------------------
@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_matches_float64_reference(emulate: bool, dtype: torch.dtype) -> None:
    layer = _layer(emulate=emulate)
    x = torch.randn(3, 8, 48)
    s_x, s_w = layer.fp8_scale_fwd[0].clone(), layer.fp8_scale_fwd[1].clone()
    bias = layer.bias.to(dtype).double()  # the bias is added in the output dtype, as in TE
    expected = _deq64(x, E4M3, s_x) @ _deq64(layer.weight, E4M3, s_w).T + bias
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        with torch.no_grad(), autocast(recipe=RECIPE):
            out = layer(x)
    assert out.dtype == dtype and out.shape == (3, 8, 80)
    if dtype == torch.float32:
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    else:  # one bf16 rounding of the float32 result: at most one bf16 ulp from float64's
        torch.testing.assert_close(out.double(), expected, rtol=2**-8, atol=1e-6)


@pytest.mark.parametrize(
    ("fmt", "grad_format"), [(Format.HYBRID, E5M2), (Format.E4M3, E4M3)], ids=["hybrid", "e4m3"]
)
def test_backward_matches_float64_reference(fmt: Format, grad_format: object) -> None:
    layer = _layer()
    x = torch.randn(3, 8, 48, requires_grad=True)
    dy = torch.randn(3, 8, 80)
    s_x, s_w, s_g = (
        layer.fp8_scale_fwd[0].clone(),
        layer.fp8_scale_fwd[1].clone(),
        layer.fp8_scale_bwd[0].clone(),
    )
    with autocast(recipe=DelayedScaling(fp8_format=fmt, amax_history_len=4)):
        out = layer(x)
    out.backward(dy)
    g = _deq64(dy.reshape(-1, 80), grad_format, s_g)
    x_q = _deq64(x.detach().reshape(-1, 48), E4M3, s_x)
    w_q = _deq64(layer.weight.detach(), E4M3, s_w)
    torch.testing.assert_close(x.grad.double(), (g @ w_q).reshape(3, 8, 48), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layer.weight.grad.double(), g.T @ x_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        layer.bias.grad.double(), dy.double().sum((0, 1)), rtol=1e-5, atol=1e-6
    )


def test_amaxes_recorded_like_te() -> None:
    """Input, weight and grad_output amaxes are recorded; output and grad_input are not (they are
    not FP8 here, and TE records them only when they are)."""
    layer = _layer()
    x = torch.randn(16, 48, requires_grad=True)
    with autocast(recipe=RECIPE):
        out = layer(x)
        fwd_row0 = layer.fp8_amax_history_fwd[0].clone()
    out.backward(torch.full_like(out, 0.5))
    assert fwd_row0.tolist() == [x.abs().max().item(), layer.weight.abs().max().item(), 0.0]
    assert layer.fp8_amax_history_bwd[-1].tolist() == [0.5, 0.0]
    assert layer.fp8_scale_fwd[2].item() == 1.0 and layer.fp8_scale_bwd[1].item() == 1.0


# ---- shapes and devices ----------------------------------------------------------------------
def test_shape_errors_name_the_layer_and_the_fix() -> None:
    layer = FP8Linear(40, 80)
    layer.fp8_name = "blocks.0.mlp.fc"
    with pytest.raises(ValueError, match=r"blocks\.0\.mlp\.fc.*in_features = 40") as info:
        with autocast():
            layer(torch.randn(8, 40))
    assert "in_features a multiple of 16" in str(info.value) and "pad" in str(info.value)
    with pytest.raises(ValueError, match=r"FP8Linear\(48 -> 80\).*multiply to 15"):
        with autocast():
            _layer()(torch.randn(3, 5, 48))


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, cc: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Fake A100")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_cuda_without_fp8_refuses_unless_emulation_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_gpu(monkeypatch, (8, 0))
    cuda = torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match=r"sm_80.*emulate=True"):
        check_recipe_device(RECIPE, cuda, None)
    assert check_recipe_device(RECIPE, cuda, True)  # asked for: the emulation
    _fake_gpu(monkeypatch, (9, 0))
    assert check_recipe_device(RECIPE, cuda, None) is False  # Hopper: real FP8 GEMMs
    assert check_recipe_device(RECIPE, "cpu", None) is True  # CPU: always emulated


# ---- state -----------------------------------------------------------------------------------
def test_state_dict_round_trip_and_history_mismatch() -> None:
    layer = _layer()
    for _ in range(3):
        with autocast(recipe=RECIPE):
            out = layer(torch.randn(16, 48))
        out.sum().backward()
    state = layer.state_dict()
    assert {k for k in state if k.startswith("fp8_")} == {
        f"fp8_{n}_{d}" for n in ("amax_history", "scale", "scale_inv") for d in ("fwd", "bwd")
    }
    fresh = FP8Linear(48, 80, amax_history_len=4)
    fresh.load_state_dict(state)
    for key, value in state.items():
        assert torch.equal(fresh.state_dict()[key], value), key
    assert fresh.fp8_state.forward.amax_history is fresh.fp8_amax_history_fwd
    with pytest.raises(RuntimeError, match=r"amax_history_len=4"):
        FP8Linear(48, 80, amax_history_len=16).load_state_dict(state)
    partial = {k: v for k, v in state.items() if k != "fp8_scale_bwd"}
    with pytest.raises(RuntimeError, match="fp8_scale_bwd"):
        fresh.load_state_dict(partial)


def test_to_keeps_the_state_float32_and_bound() -> None:
    layer = _layer().to(torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16 and layer.fp8_scale_fwd.dtype == torch.float32
    assert layer.fp8_state.forward.scale is layer.fp8_scale_fwd


def test_history_follows_the_recipe() -> None:
    layer = _layer()
    with torch.no_grad(), autocast(recipe=DelayedScaling(amax_history_len=7)):
        layer(torch.randn(8, 48))
    assert layer.fp8_amax_history_fwd.shape == (7, 3) and layer.fp8_amax_history_bwd.shape == (7, 2)


# ---- converting a model -------------------------------------------------------------------------
class _Net(nn.Module):
    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, widths[0])
        self.layers = nn.Sequential(
            *(nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False))
        )
        self.lm_head = nn.Linear(widths[-1], 10, bias=False)
        self.lm_head.weight = self.emb.weight if widths[-1] == widths[0] else self.lm_head.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.layers(self.emb(x)))


def test_convert_keeps_outputs_and_parameters() -> None:
    torch.manual_seed(0)
    net = _Net((32, 64, 32))
    x = torch.randint(0, 10, (2, 8))
    before, params = net(x), list(net.parameters())
    convert_to_fp8(net)
    assert [type(m) for m in net.layers] == [FP8Linear, FP8Linear]
    assert type(net.lm_head) is nn.Linear and type(net.emb) is nn.Embedding  # tied head: kept
    assert net.layers[1].fp8_name == "layers.1"
    assert torch.equal(net(x), before) and list(net.parameters()) == params


def test_convert_lists_every_bad_layer() -> None:
    net = _Net((32, 36, 24))  # out 36 % 8, in 36 % 16 and in 24 % 16 break TE's rule
    with pytest.raises(ValueError) as info:
        convert_to_fp8(net)
    message = str(info.value)
    assert "layers.0: 32 -> 36" in message and "layers.1: 36 -> 24" in message
    assert "lm_head" not in message  # never converted


def test_outside_fp8_bit_equal_to_f_linear_after_training() -> None:
    layer = _layer()
    with autocast(recipe=RECIPE):
        layer(torch.randn(8, 48)).sum().backward()
    x = torch.randn(8, 48)
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))


# ---- the CPU GEMM: an FP32 emulation, never torch._scaled_mm -------------------------------
_REAL_SCALED_MM = torch._scaled_mm  # imported before the conftest guard patches it per test


@pytest.mark.cpu_scaled_mm
@pytest.mark.parametrize("m,k,n", [(5, 123, 37), (16, 48, 80), (1, 17, 3), (40, 64, 33)])
@pytest.mark.parametrize("a_fmt,b_fmt", [(E4M3, E4M3), (E5M2, E4M3)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_cpu_gemm_agrees_with_scaled_mm(
    m: int, k: int, n: int, a_fmt: object, b_fmt: object, out_dtype: torch.dtype
) -> None:
    """The emulation (widen, float32 matmul, scale the sum) and torch's own CPU FP8 GEMM (which
    scales the operands first) on odd shapes, both operand formats, non-power-of-two scales and a
    bias: both within float32 accumulation rounding of a float64 reference."""
    g = torch.Generator().manual_seed(m * k * n)
    a_scale, b_scale = torch.tensor(37.3), torch.tensor(0.81)
    a = quantize(torch.randn(m, k, generator=g) * 3, a_fmt, a_scale)
    b = quantize(torch.randn(n, k, generator=g), b_fmt, b_scale).t()  # (k, n), column-major
    bias = torch.randn(n, generator=g).to(out_dtype)
    a_inv, b_inv = 1 / a_scale, 1 / b_scale
    ours = emulated_gemm(a, a_inv, b, b_inv, bias, out_dtype)
    torch_ = _REAL_SCALED_MM(a, b, scale_a=a_inv, scale_b=b_inv, bias=bias, out_dtype=out_dtype)
    assert ours.dtype == torch_.dtype == out_dtype and ours.shape == (m, n)
    exact = dequantize(a, a_inv, torch.float64) @ dequantize(b, b_inv, torch.float64)
    exact = exact + bias.double()
    # float32 accumulation over k terms: each side is within k * eps32 * sum|a||b| of the exact
    # result; a bf16 output adds one rounding of at most half a bf16 ulp (2^-8 relative).
    magnitude = (
        dequantize(a, a_inv, torch.float64).abs() @ dequantize(b, b_inv, torch.float64).abs()
    )
    bound = k * 2.0**-23 * (magnitude + bias.double().abs())
    if out_dtype == torch.bfloat16:
        bound = bound + 2.0**-8 * exact.abs()
    for got in (ours, torch_):
        assert ((got.double() - exact).abs() <= bound).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast cannot turn it into BF16 math
        assert torch.equal(emulated_gemm(a, a_inv, b, b_inv, bias, out_dtype), ours)


def test_scaled_gemm_on_cpu_is_the_emulation() -> None:
    """``scaled_gemm`` on CPU tensors takes the emulated path (bitwise), whatever ``emulate``."""
    g = torch.Generator().manual_seed(3)
    a = quantize(torch.randn(32, 48, generator=g), E4M3, torch.tensor(2.0))
    b = quantize(torch.randn(48, 16, generator=g), E4M3, torch.tensor(4.0))
    inv = torch.tensor(0.5), torch.tensor(0.25)
    want = emulated_gemm(a, inv[0], b, inv[1], None, torch.bfloat16)
    for emulate in (False, True):
        assert torch.equal(scaled_gemm(a, inv[0], b, inv[1], None, torch.bfloat16, emulate), want)
