"""perf.measured: speed statements printed from measurements, never assumed."""

from __future__ import annotations

import pytest
import torch

from tutorial_lib import perf
from tutorial_lib.hardware import describe_device
from tutorial_lib.perf.measured import GemmRates


@pytest.mark.parametrize(
    "a,b,expected",
    [
        (1.0, 4.5, "BF16 ran 4.5x faster than FP32 here"),
        (4.5, 1.0, "BF16 ran 4.5x slower than FP32 here"),
        (1.0, 1.05, "BF16 and FP32 ran within 10% of each other here"),
        (1.05, 1.0, "BF16 and FP32 ran within 10% of each other here"),
        (1.0, 1.2, "BF16 ran 1.2x faster than FP32 here"),
    ],
)
def test_compare_times_says_what_was_measured(a: float, b: float, expected: str) -> None:
    assert perf.compare_times("BF16", a, "FP32", b, "here") == expected


def test_compare_times_refuses_non_positive_times() -> None:
    with pytest.raises(ValueError, match="positive"):
        perf.compare_times("A", 0.0, "B", 1.0, "here")


def test_gemm_rates_sentence_and_table_follow_the_numbers() -> None:
    rates = GemmRates(
        n=100,
        seconds={"fp32": 2e-3, "bf16": 5e-4},
        where="on this CPU (X; BF16 matrix instructions: AMX-BF16)",
    )
    assert rates.gflops("fp32") == pytest.approx(2 * 100**3 / 2e-3 / 1e9)
    assert rates.compare("bf16", "fp32") == (
        "BF16 ran 4.0x faster than FP32 on this CPU (X; BF16 matrix instructions: AMX-BF16)"
    )
    table = rates.table()
    assert "100x100x100 GEMM on this CPU" in table and "bfloat16 matmul" in table


def test_measure_gemm_rates_on_this_cpu() -> None:
    """Real timings at a small odd size: every math runs, and the device is named."""
    rates = perf.measure_gemm_rates(33, ("fp32", "bf16"), device="cpu", iters=1)
    assert set(rates.seconds) == {"fp32", "bf16"}
    assert all(t > 0 for t in rates.seconds.values())
    assert "float32 matmul" in rates.table() and "bfloat16 matmul" in rates.table()
    info = describe_device("cpu")
    assert rates.where.startswith(f"on this CPU ({info.name}; BF16 matrix instructions: ")
    sentence = rates.compare("bf16", "fp32")
    assert sentence.startswith(("BF16 ran", "BF16 and FP32 ran within")) and rates.where in sentence


def test_on_this_device_names_the_cpu_and_its_bf16_instructions() -> None:
    info = describe_device("cpu")
    assert info.cpu is not None
    bf16 = [f for f in info.cpu.features if "BF16" in f]
    assert perf.on_this_device("cpu") == (
        f"on this CPU ({info.name}; BF16 matrix instructions: {', '.join(bf16) or 'none detected'})"
    )


def test_measure_gemm_rates_errors() -> None:
    with pytest.raises(ValueError, match="unknown math 'fp4'"):
        perf.measure_gemm_rates(8, ("fp4",), device="cpu")
    with pytest.raises(ValueError, match="n >= 1"):
        perf.measure_gemm_rates(0, device=torch.device("cpu"))
