"""Tests for the FP8 roofline cost model (``tutorial_lib.bench.fp8_model``)."""

from __future__ import annotations

import pytest

from tutorial_lib.bench import linear_layer_cost, sweep
from tutorial_lib.bench.fp8_model import GemmCost
from tutorial_lib.hardware import SPECS, DeviceSpec

H100, H200 = SPECS["H100 SXM"], SPECS["H200"]
GRID = [128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384]


def _toy(bf16: float, fp8: float, bandwidth: float) -> DeviceSpec:
    """Round numbers, so that expected times can be worked out by hand."""
    return DeviceSpec("toy", {"bf16": bf16, "fp8": fp8}, bandwidth, "test")


def test_hand_computed_compute_bound() -> None:
    """M = N = K = 1000 on 100/200 TFLOP/s, 1 TB/s: every GEMM is 2e9 FLOPs, compute-bound.

    BF16: 3 x 2e9 / 1e14 = 60 us.  FP8: 3 x 2e9 / 2e14 = 30 us.
    Quantization: 5 bytes x (x 1e6 + w 1e6 + dy 1e6) = 1.5e7 B / 1e12 B/s = 15 us.
    """
    cost = linear_layer_cost(1000, 1000, 1000, _toy(1e14, 2e14, 1e12))
    assert (cost.m, cost.n, cost.k) == (1000, 1000, 1000)
    assert cost.bf16_s == pytest.approx(60e-6)
    assert cost.fp8_gemm_s == pytest.approx(30e-6)
    assert cost.fp8_quant_s == pytest.approx(15e-6)
    assert cost.fp8_total_s == pytest.approx(45e-6)
    assert cost.speedup == pytest.approx(4 / 3)


def test_hand_computed_memory_bound_shapes() -> None:
    """M = 10 tokens, K = 20 in, N = 30 out on a 1 GB/s device: all memory-bound.

    BF16, each GEMM 2 x (MK + KN + MN) = 2200 B: 6600 B.
    FP8 (operands 1 B, output 2 B): forward (x, w -> y) 200 + 600 + 2 x 300 = 1400;
    dgrad (dy, w -> dx) 300 + 600 + 2 x 200 = 1300; wgrad (dy, x -> dw) 300 + 200 + 2 x 600 =
    1700: 4400 B. Quantization 5 x (200 + 600 + 300) = 5500 B.
    """
    cost = linear_layer_cost(10, 20, 30, _toy(1e12, 2e12, 1e9))
    assert (cost.m, cost.n, cost.k) == (10, 30, 20)
    assert cost.bf16_s == pytest.approx(6600e-9)
    assert cost.fp8_gemm_s == pytest.approx(4400e-9)
    assert cost.fp8_quant_s == pytest.approx(5500e-9)
    assert cost.speedup == pytest.approx(6600 / 9900)


def test_small_gemms_do_not_pay_off() -> None:
    """h = 256, 2048 tokens: quantization costs more than FP8 saves (cf. TE issue #445)."""
    for spec in (H100, H200):
        [cost] = sweep([256], 2048, spec)
        assert cost.speedup < 1.0
        assert cost.fp8_quant_s > cost.bf16_s - cost.fp8_gemm_s


def test_1024_cubed_is_slower_in_fp8() -> None:
    """The shape of TE issue #445: a 1024 x 1024 x 1024 GEMM."""
    assert linear_layer_cost(1024, 1024, 1024, H100).speedup < 1.0


def test_large_gemms_approach_but_stay_below_2x() -> None:
    for spec in (H100, H200):
        [cost] = sweep([8192], 16384, spec)
        assert 1.7 < cost.speedup < 2.0
        assert cost.bf16_s == pytest.approx(2 * cost.fp8_gemm_s)  # compute-bound: 2x peak


@pytest.mark.parametrize("spec", [H100, H200], ids=["H100", "H200"])
@pytest.mark.parametrize("tokens", [2048, 16384])
def test_speedup_is_monotone_in_hidden_size(spec: DeviceSpec, tokens: int) -> None:
    speedups = [c.speedup for c in sweep(GRID, tokens, spec)]
    assert all(b >= a - 1e-12 for a, b in zip(speedups, speedups[1:], strict=False))
    assert speedups[-1] < 2.0


def test_sweep_shapes() -> None:
    costs = sweep([64, 128], 512, H100)
    assert all(isinstance(c, GemmCost) for c in costs)
    assert [(c.m, c.n, c.k) for c in costs] == [(512, 256, 64), (512, 512, 128)]


def test_efficiency() -> None:
    """Peak efficiency slows the GEMMs, not the casts; equal scaling of both changes nothing."""
    full = linear_layer_cost(16384, 1024, 4096, H100)
    derated = linear_layer_cost(16384, 1024, 4096, H100, efficiency=0.7)
    assert derated.bf16_s > full.bf16_s and derated.fp8_quant_s == full.fp8_quant_s
    assert derated.speedup > full.speedup
    both = linear_layer_cost(16384, 1024, 4096, H100, 0.5, bandwidth_efficiency=0.5)
    assert both.speedup == pytest.approx(full.speedup)
    assert both.fp8_total_s == pytest.approx(2 * full.fp8_total_s)


@pytest.mark.parametrize(
    "kwargs", [{"efficiency": 0.0}, {"efficiency": 1.5}, {"bandwidth_efficiency": -1.0}]
)
def test_bad_efficiency(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="efficiency"):
        linear_layer_cost(16, 16, 16, H100, **kwargs)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="tokens must be a positive integer, got 0"):
        linear_layer_cost(0, 16, 16, H100)
    with pytest.raises(ValueError, match="fp8"):
        linear_layer_cost(16, 16, 16, SPECS["A100"])  # no FP8 tensor cores
