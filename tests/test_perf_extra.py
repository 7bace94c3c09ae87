"""Tests for the timing additions (rotating inputs, cache sizes, naive vs synced timers) and
``perf.memory_report``."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
import torch

from tutorial_lib.perf import (
    benchmark,
    l2_cache_bytes,
    make_rotating_inputs,
    memory_report,
    naive_time,
    peak_memory_bytes,
    synced_time,
)
from tutorial_lib.perf import timing as timing_mod
from tutorial_lib.perf.memory import MemoryReport

if TYPE_CHECKING:
    from conftest import FakeStream

# ---- benchmark(..., inputs=...) ------------------------------------------------------------


@pytest.mark.parametrize(("warmup", "iters", "n"), [(2, 7, 3), (0, 5, 5), (4, 3, 1), (5, 11, 4)])
def test_benchmark_rotates_inputs(warmup: int, iters: int, n: int) -> None:
    inputs = [(torch.full((3,), float(i)), i) for i in range(n)]
    seen: list[tuple[int, int]] = []
    result = benchmark(
        lambda t, i: seen.append((id(t), i)),
        warmup=warmup,
        iters=iters,
        device="cpu",
        inputs=inputs,
    )
    assert result.iters == iters and len(seen) == warmup + iters
    timed = seen[warmup:]
    assert timed == [(id(inputs[i % n][0]), i % n) for i in range(iters)]
    warm = [i for _, i in seen[:warmup]]
    assert warm == [(j - warmup) % n for j in range(warmup)]  # the warm-up rotates too
    if n > 1:  # one unbroken rotation: no input twice in a row, even across the boundary
        labels = [i for _, i in seen]
        assert all(a != b for a, b in zip(labels, labels[1:], strict=False))


def test_benchmark_rotation_uses_every_input_in_the_timed_runs() -> None:
    inputs = [(k,) for k in range(6)]
    seen: list[int] = []
    benchmark(seen.append, warmup=1, iters=6, device="cpu", inputs=inputs)
    assert sorted(seen[1:]) == list(range(6))


def test_benchmark_rejects_empty_inputs() -> None:
    with pytest.raises(ValueError, match="inputs"):
        benchmark(lambda: None, warmup=1, iters=2, device="cpu", inputs=[])


def test_benchmark_without_inputs_calls_with_no_arguments() -> None:
    calls: list[tuple] = []
    benchmark(lambda *a: calls.append(a), warmup=1, iters=2, device="cpu", inputs=None)
    assert calls == [(), (), ()]


# ---- cache sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("32K", 32 * 1024),
        ("1024K", 2**20),
        ("32M", 32 * 2**20),
        ("32768K\n", 32 * 2**20),
        ("1G", 2**30),
        ("48", 48),
        (" 12k ", 12 * 1024),
        ("6MiB", 6 * 2**20),
    ],
)
def test_parse_cache_size(text: str, expected: int) -> None:
    assert timing_mod._parse_cache_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "32X", "3.5M", "-1K", "32 M B"])
def test_parse_cache_size_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="cache size"):
        timing_mod._parse_cache_size(text)


def _fake_cache_dir(root: Path, sizes: dict[str, str]) -> Path:
    for index, size in sizes.items():
        (root / index).mkdir()
        (root / index / "size").write_text(size + "\n")
    return root


def test_cpu_cache_bytes_picks_the_largest_level(tmp_path: Path) -> None:
    root = _fake_cache_dir(
        tmp_path, {"index0": "48K", "index1": "32K", "index2": "1280K", "index3": "49152K"}
    )
    (root / "index4").mkdir()  # no size file: skipped
    (root / "index5").mkdir()
    (root / "index5" / "size").write_text("unknown")  # unparsable: skipped
    assert timing_mod._cpu_cache_bytes(root) == 48 * 2**20


def test_cpu_cache_bytes_none_without_sysfs(tmp_path: Path) -> None:
    assert timing_mod._cpu_cache_bytes(tmp_path) is None
    assert timing_mod._cpu_cache_bytes(tmp_path / "missing") is None


def test_l2_cache_bytes_cpu_reads_sysfs() -> None:
    value = l2_cache_bytes("cpu")
    assert value == timing_mod._cpu_cache_bytes()
    if timing_mod._CPU_CACHE_DIR.is_dir():
        assert value is not None and value >= 2**16


def test_l2_cache_bytes_cuda_uses_device_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def props(index: int) -> SimpleNamespace:
        asked.append(index)
        return SimpleNamespace(L2_cache_size=50 * 2**20)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    assert l2_cache_bytes("cuda:1") == 50 * 2**20
    assert asked == [1]


# ---- make_rotating_inputs ------------------------------------------------------------------


def _counting_maker(numel: int, dtype: torch.dtype = torch.float32) -> tuple[list[int], object]:
    calls: list[int] = []

    def make() -> tuple:
        calls.append(1)
        return (torch.zeros(numel, dtype=dtype), 7, "not a tensor")

    return calls, make


@pytest.mark.parametrize(
    ("numel", "dtype", "threshold", "expected"),
    [
        (1000, torch.float32, 10_000, 3),  # 4000 B each: 12000 > 10000 after 3
        (1000, torch.float32, 12_000, 4),  # must *exceed*: 12000 is not enough
        (1000, torch.bfloat16, 5_999, 3),  # 2000 B each
        (37, torch.float64, 0, 1),  # at least one copy
        (1, torch.uint8, 10**9, 5),
    ],  # capped by max_copies
)
def test_make_rotating_inputs_threshold(
    numel: int, dtype: torch.dtype, threshold: int, expected: int
) -> None:
    calls, make = _counting_maker(numel, dtype)
    copies = make_rotating_inputs(make, threshold, max_copies=5)
    assert len(copies) == len(calls) == expected
    assert len({id(c[0]) for c in copies}) == expected  # distinct tensors, not one reused
    assert all(isinstance(c, tuple) and c[1:] == (7, "not a tensor") for c in copies)


def test_make_rotating_inputs_exceeds_the_cache() -> None:
    cache = 3 * 2**20
    copies = make_rotating_inputs(lambda: (torch.empty(123, 457),), 2 * cache, max_copies=1000)
    total = sum(c[0].numel() * 4 for c in copies)
    assert total > 2 * cache >= total - 123 * 457 * 4  # just enough, not one more


def test_make_rotating_inputs_rejects_zero_copies() -> None:
    with pytest.raises(ValueError, match="max_copies"):
        make_rotating_inputs(lambda: (torch.empty(1),), 10, max_copies=0)


# ---- naive vs synced timers ----------------------------------------------------------------


@pytest.fixture
def async_queue(stream: FakeStream, monkeypatch: pytest.MonkeyPatch) -> FakeStream:
    """The conftest's simulated asynchronous stream, as the timers' ``synchronize``."""
    monkeypatch.setattr(timing_mod, "synchronize", stream.synchronize)
    return stream


def test_naive_time_sees_only_the_launch(async_queue: FakeStream) -> None:
    # 150 ms of queued work; the launch takes microseconds (half the work is a loose bound for
    # a busy shared machine, and still fails if naive_time waited for the work).
    assert naive_time(lambda: async_queue.launch(0.15)) < 0.075


def test_synced_time_sees_the_work_but_not_earlier_work(async_queue: FakeStream) -> None:
    assert synced_time(lambda: async_queue.launch(0.03), "cpu") >= 0.028
    async_queue.launch(0.15)  # queued before the timed call: must not be charged to it
    t = synced_time(lambda: async_queue.launch(0.01), "cpu")
    assert 0.009 <= t < 0.1


def test_naive_time_is_right_for_synchronous_work() -> None:
    assert naive_time(lambda: time.sleep(0.01)) >= 0.0095


# ---- memory_report -------------------------------------------------------------------------


def test_memory_report_cpu() -> None:
    report = memory_report("cpu")
    assert report.device == "cpu"
    assert report.peak_allocated is None and report.peak_reserved is None
    assert 0 < report.peak_rss <= peak_memory_bytes("cpu")
    text = str(report)
    assert "n/a" in text and f"{report.peak_rss / 2**20:.1f} MiB" in text


def test_memory_report_cuda_uses_allocator_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 3 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: 5 * 2**20 + 2**19)
    report = memory_report(torch.device("cuda", 0))
    assert (report.device, report.peak_allocated, report.peak_reserved) == (
        "cuda:0",
        3 * 2**20,
        5 * 2**20 + 2**19,
    )
    assert report.peak_rss > 0


def test_memory_report_str_in_mib() -> None:
    text = str(MemoryReport("cuda:0", 3 * 2**20, 5 * 2**20 + 2**19, 100 * 2**20))
    assert text == (
        "cuda:0: peak allocated 3.0 MiB, peak reserved 5.5 MiB, process peak RSS 100.0 MiB"
    )
