"""``bench.overheads``: host against finished time, the compile-mode rows a CPU can and cannot
give, and the LM head's GEMMs at a padded vocabulary."""

from __future__ import annotations

import pytest
import torch

from tutorial_lib.bench import overheads


def test_host_and_finished_time_of_a_cpu_step() -> None:
    a = torch.randn(256, 256)
    times = overheads.host_and_device_ms(lambda: a @ a, "cpu", iters=3)
    assert 0 < times["host_ms"] <= times["finished_ms"]  # a CPU finishes what it issues


def test_compile_modes_on_a_cpu_say_why_not() -> None:
    calls: list[str | None] = []

    def make_step(mode: str | None):  # type: ignore[no-untyped-def]
        calls.append(mode)
        return lambda: None

    rows = overheads.compile_mode_rows(make_step, "cpu", modes=overheads.COMPILE_MODES, iters=1)
    by_mode = {r["mode"]: r for r in rows}
    assert calls == [None, "default"]  # eager and default ran; the CUDA-graph modes did not
    assert by_mode["eager"]["step_ms"] >= 0 and "compile_s" in by_mode["default"]
    assert "CUDA graphs" in by_mode["reduce-overhead"]["skipped"]
    assert "hopper preset" in by_mode["max-autotune"]["skipped"]


def test_vocab_padding_rows_count_the_head_flops() -> None:
    rows = overheads.vocab_padding_rows(8, 16, vocabs=(97, 128), iters=2)
    assert [r["vocab"] for r in rows] == [97, 128]
    assert [r["multiple_of_64"] for r in rows] == [False, True]
    for r in rows:
        assert r["tflops"] == pytest.approx(6 * 8 * 16 * r["vocab"] / (r["time_ms"] / 1e3) / 1e12)
