"""Tests for tutorial_lib.bench.gemm_bench: BF16 vs FP8 GEMMs timed on rotating inputs."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import dataclasses  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from tutorial_lib.bench import gemm_bench as gs  # noqa: E402
from tutorial_lib.config import PRESETS, RunPreset  # noqa: E402

CACHE = 256 * 2**10  # a pretend 256 KiB cache: tiny GEMMs need many sets to exceed it
SMALL, WIDTHS = 16, (32, 48)


def _preset(widths: tuple, small: int = SMALL, warmup: int = 0, iters: int = 2) -> RunPreset:
    """The ci preset with the sweep's widths and timing set for a test."""
    return dataclasses.replace(
        PRESETS["ci"],
        gemm_widths=widths,
        gemm_small_width=small,
        bench_warmup=warmup,
        bench_iters=iters,
    )


@pytest.fixture(scope="module")
def records() -> list[gs.GemmTiming]:
    """One tiny sweep on the CPU (two timed calls each): a few hundred milliseconds."""
    return gs.gemm_sweep(_preset(WIDTHS), "cpu", cache_bytes=CACHE)


def test_records_come_in_order_with_consistent_fields(records: list[gs.GemmTiming]) -> None:
    expected = [(n, math) for n in (SMALL, *WIDTHS) for math in ("bf16", "fp8")]
    assert [(r.width, r.dtype) for r in records] == expected
    for r in records:
        assert r.iters == 2 and r.median_s > 0 and r.cache_bytes == CACHE
        assert r.tflops == pytest.approx(2 * r.width**3 / r.median_s / 1e12)
        assert r.bytes_per_set == 2 * r.width**2 * (2 if r.dtype == "bf16" else 1)


def test_the_sweep_rotates_through_more_than_the_given_cache(
    records: list[gs.GemmTiming],
) -> None:
    sweep = [r for r in records if r.role == gs.SWEEP]
    assert {r.width for r in sweep} == set(WIDTHS)
    for r in sweep:
        assert r.buffers >= 2 and r.buffers * r.bytes_per_set > 2 * CACHE
        assert r.l2_resident is False


def test_the_small_gemm_is_labelled_launch_and_l2_bound(records: list[gs.GemmTiming]) -> None:
    small = [r for r in records if r.role == gs.SMALL]
    assert [r.width for r in small] == [SMALL, SMALL] and gs.SMALL == "launch/L2-bound"
    assert all(r.buffers == 1 and r.l2_resident is True for r in small)


def test_cpu_fp8_is_the_emulation_and_says_so(records: list[gs.GemmTiming]) -> None:
    # conftest makes torch._scaled_mm fail on CPU tensors, so this also proves it was not called
    for r in records:
        assert r.path == (gs.FP8_EMULATION if r.dtype == "fp8" else gs.BF16_MATMUL)
    assert "emulation cost, not FP8 speed" in gs.FP8_EMULATION


def test_rotation_bytes() -> None:
    assert gs.rotation_bytes(1000, 50 * 2**20) == 100 * 2**20
    assert gs.rotation_bytes(1000, None) == 128 * 2**20  # unknown cache: 64 MiB assumed
    assert gs.rotation_bytes(300 * 2**20, 50 * 2**20) == 300 * 2**20  # one set: a second comes


def test_ci_widths_are_small_and_hopper_widths_span_4096_to_8192() -> None:
    ci, hopper = PRESETS["ci"], PRESETS["hopper"]
    for preset in (ci, hopper):
        assert all(n % 16 == 0 for n in (*preset.gemm_widths, preset.gemm_small_width))
        assert preset.gemm_small_width < min(preset.gemm_widths)
    # BF16 ran at ~1.2 GFLOP/s on the AVX2-only EPYC (REFERENCE.md); the ci sweep's BF16 GEMMs,
    # warm-up included, must stay near a second there (the FP8 emulation is an FP32 GEMM).
    calls = ci.bench_warmup + ci.bench_iters
    bf16_flop = sum(2 * n**3 * calls for n in (ci.gemm_small_width, *ci.gemm_widths))
    assert max(ci.gemm_widths) <= 512 and bf16_flop < 1.5e9
    assert (min(hopper.gemm_widths), max(hopper.gemm_widths)) == (4096, 8192)
    assert hopper.gemm_small_width == 1024


@pytest.mark.parametrize("bad", [100, 0, 8, 16.0])
def test_widths_must_be_multiples_of_16(bad: object) -> None:
    with pytest.raises(ValueError, match="multiples of 16"):
        gs.gemm_sweep(_preset((bad,)), "cpu", cache_bytes=CACHE)


def test_table_and_plot(records: list[gs.GemmTiming]) -> None:
    table = gs.gemm_sweep_table(records)
    assert "GFLOP/s" in table  # a CPU: below 1 TFLOP/s
    assert "L2-resident: launch/L2-bound" in table and "from memory: rotating inputs" in table
    assert f"FP8: {gs.FP8_EMULATION}" in table
    fig = gs.plot_gemm_sweep(records, hardware="measured on a test CPU")
    ax = fig.axes[0]
    assert ax.get_title() and "GFLOP/s" in ax.get_ylabel() and "width" in ax.get_xlabel()
    legend = ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == [
        "BF16, rotating inputs",
        "BF16, same inputs: launch/L2-bound",
        "FP8 (emulated), rotating inputs",
        "FP8 (emulated), same inputs: launch/L2-bound",
    ]
    plt.close(fig)  # type: ignore[arg-type]


def test_units_switch_to_tflops_on_fast_records(records: list[gs.GemmTiming]) -> None:
    fast = [gs.GemmTiming(**{**vars(r), "tflops": 500.0}) for r in records]
    assert gs.flops_unit(fast) == ("TFLOP/s", 1.0) and gs.flops_unit(records)[0] == "GFLOP/s"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_path_matches_fp8_support() -> None:
    recs = gs.gemm_sweep(_preset((256,), small=64, warmup=1), "cuda")
    fp8_ok = gs.fp8_gemm_status(torch.device("cuda"))[0]
    for r in (r for r in recs if r.dtype == "fp8"):
        assert r.path == (gs.FP8_TENSOR_CORES if fp8_ok else gs.FP8_EMULATION)
