"""Tests for tutorial_lib.perf: honest timing, throughput and MFU, memory, profiler tables."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tutorial_lib.hardware import SPECS
from tutorial_lib.perf import (
    benchmark,
    format_mfu,
    format_op_table,
    mfu,
    peak_memory_bytes,
    profile_top_ops,
    reset_peak_memory,
)
from tutorial_lib.perf import timing as timing_mod
from tutorial_lib.perf.profiler import OpStat
from tutorial_lib.perf.timing import naive_time, synced_time

# ---- benchmark -----------------------------------------------------------------------------


def test_benchmark_counts_calls_and_summarises() -> None:
    calls = []
    result = benchmark(lambda: calls.append(1), warmup=2, iters=7, device="cpu")
    assert len(calls) == 2 + 7  # warm-up calls run but are not timed
    assert result.iters == len(result.times) == 7
    assert result.min <= result.median <= result.max
    assert result.median == sorted(result.times)[3]
    assert all(t >= 0 for t in result.times)


class VirtualDevice:
    """A deterministic asynchronous device on a virtual clock: ``launch(seconds)`` queues work
    and returns at once (no time passes on the host), ``synchronize`` moves the host clock to
    the end of the queued work, ``perf_counter`` reads the host clock. Patched into ``timing``,
    it makes every measured time exact, however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 0.0  # the host's clock
        self.busy_until = 0.0  # when the queued work finishes
        self.syncs = 0

    def perf_counter(self) -> float:
        return self.now

    def host_work(self, seconds: float) -> None:
        self.now += seconds

    def launch(self, seconds: float) -> None:
        self.busy_until = max(self.busy_until, self.now) + seconds

    def synchronize(self, device: object = None) -> None:
        self.syncs += 1
        self.now = max(self.now, self.busy_until)


@pytest.fixture
def virtual(monkeypatch: pytest.MonkeyPatch) -> VirtualDevice:
    dev = VirtualDevice()
    monkeypatch.setattr(timing_mod, "time", SimpleNamespace(perf_counter=dev.perf_counter))
    monkeypatch.setattr(timing_mod, "synchronize", dev.synchronize)
    return dev


def test_benchmark_times_each_call_on_the_clock(virtual: VirtualDevice) -> None:
    """Each timed call gets exactly its own duration; the warm-up calls are run but not timed."""
    durations = iter([5.0, 7.0] + [0.03, 0.01, 0.02, 0.05, 0.04])  # 2 warm-up, then 5 timed
    result = benchmark(lambda: virtual.host_work(next(durations)), warmup=2, iters=5, device="cpu")
    assert result.times == pytest.approx((0.03, 0.01, 0.02, 0.05, 0.04), abs=1e-12)
    assert (result.min, result.median, result.max) == pytest.approx((0.01, 0.03, 0.05))
    assert next(durations, None) is None  # every call ran, none twice
    assert virtual.now == pytest.approx(12.15)


@pytest.mark.parametrize(("warmup", "iters"), [(0, 0), (3, -1), (-1, 5)])
def test_benchmark_rejects_bad_counts(warmup: int, iters: int) -> None:
    with pytest.raises(ValueError, match="iters"):
        benchmark(lambda: None, warmup=warmup, iters=iters, device="cpu")


def test_naive_timing_sees_only_the_launch(virtual: VirtualDevice) -> None:
    """The control: timing a launch without synchronising sees none of the work."""
    assert naive_time(lambda: virtual.launch(0.05)) == 0.0
    assert synced_time(lambda: virtual.launch(0.05), "cpu") == pytest.approx(0.05)


def test_benchmark_waits_for_asynchronous_work(virtual: VirtualDevice) -> None:
    work = 0.02
    result = benchmark(lambda: virtual.launch(work), warmup=8, iters=5, device="cpu")
    # Each timed call includes its own work, because benchmark synchronises inside the timing,
    # and none of the warm-up's queued work (8 x 20 ms), because it synchronises after it.
    assert result.times == pytest.approx((work,) * 5, abs=1e-12)
    assert virtual.syncs == 1 + 5  # once after the warm-up, once per timed call


# ---- throughput and MFU --------------------------------------------------------------------


def test_mfu_unknown_device_or_dtype_is_none() -> None:
    assert mfu(1e6, 1e9, None, "bf16") is None
    assert mfu(1e6, 1e9, SPECS["A100"], "fp8") is None  # A100 has no FP8 tensor cores


def test_mfu_h100_bf16_against_datasheet() -> None:
    # 300k tokens/s of a model at 1.2 GFLOP/token (fwd + bwd) on an H100 SXM: 360 TFLOP/s of
    # the datasheet's 989.5 dense BF16 TFLOP/s.
    value = mfu(300_000, 1.2e9, SPECS["H100 SXM"], "bf16")
    assert value == pytest.approx(360e12 / 989.5e12)
    assert mfu(300_000, 1.2e9, SPECS["H100 SXM"], "fp8") == pytest.approx(360e12 / 1979e12)


@settings(max_examples=50, deadline=None)
@given(flops_per_token=st.floats(1e3, 1e13), fraction=st.floats(0.0, 0.99))
def test_mfu_below_one_at_table_peak(flops_per_token: float, fraction: float) -> None:
    for spec in SPECS.values():
        for dtype, peak in spec.peak_flops.items():
            tps = peak / flops_per_token * fraction
            value = mfu(tps, flops_per_token, spec, dtype)
            assert value is not None and 0 <= value < 1
            assert value == pytest.approx(fraction, abs=1e-12)


def test_format_mfu() -> None:
    assert format_mfu(0.4567) == "45.7%"
    assert format_mfu(1.0) == "100.0%"
    assert "n/a" in format_mfu(None)


# ---- memory --------------------------------------------------------------------------------


def _current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_peak_memory_cpu_grows_with_a_big_allocation() -> None:
    reset_peak_memory("cpu")  # a no-op on the CPU, but must not raise
    before = peak_memory_bytes("cpu")
    assert before > 0
    assert before >= _current_rss_bytes() * 0.9  # a peak is at least the current usage
    # The peak only grows once usage passes it: allocate past the old peak by >= 200 MB.
    size = max(300 * 2**20, before - _current_rss_bytes() + 200 * 2**20)
    if size > 4 * 2**30:
        pytest.skip("this process's earlier peak is too far above its current usage")
    big = torch.ones(size // 4, dtype=torch.float32)  # ones: every page is touched
    after = peak_memory_bytes("cpu")
    del big
    assert after >= before + 150 * 2**20
    assert peak_memory_bytes(torch.device("cpu")) >= after  # monotone


# ---- profiler ------------------------------------------------------------------------------


def _matmul_workload() -> Callable[[], torch.Tensor]:
    a = torch.randn(192, 160)
    b = torch.randn(160, 224)
    return lambda: torch.relu(a @ b).sum()


def test_profile_top_ops_on_a_matmul() -> None:
    stats = profile_top_ops(_matmul_workload(), top=5, warmup=1, device="cpu")
    assert 1 <= len(stats) <= 5
    assert all(isinstance(s, OpStat) for s in stats)
    times = [s.self_time_s for s in stats]
    assert times == sorted(times, reverse=True)
    assert all(0 < s.share <= 1 and s.calls >= 1 and s.self_time_s > 0 for s in stats)
    assert sum(s.share for s in stats) <= 1 + 1e-9
    names = {s.name for s in stats}
    assert names & {"aten::mm", "aten::addmm", "aten::matmul"}, names


def test_profile_top_ops_truncates_to_top() -> None:
    full = profile_top_ops(_matmul_workload(), top=50, warmup=0, device="cpu")
    top1 = profile_top_ops(_matmul_workload(), top=1, warmup=0, device="cpu")
    assert len(top1) == 1 and len(full) >= 2
    assert full[0].share >= full[1].share


def test_format_op_table() -> None:
    stats = [
        OpStat("aten::mm", 3, 0.012, 0.75),
        OpStat("aten::relu", 3, 0.004, 0.25),
    ]
    lines = format_op_table(stats).splitlines()
    assert len(lines) == 1 + len(stats)
    assert lines[0].split() == ["op", "calls", "self", "ms", "share"]
    assert lines[1].split() == ["aten::mm", "3", "12.00", "75.0%"]
    assert lines[2].split() == ["aten::relu", "3", "4.00", "25.0%"]
    assert len({len(line) for line in lines}) == 1  # fixed width: the columns line up
    assert format_op_table([]).splitlines()[0].split()[0] == "op"
