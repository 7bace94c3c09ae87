"""Tests for benchmarks/fp8_accumulation.py, run in-process on a tiny model into a temporary
folder: a row per FP8 precision, both variants timed, the ratio and the budget recorded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tutorial_lib import config
from tutorial_lib.config import GPTConfig, RunPreset
from tutorial_lib.fp8.policy import FP8_RECIPE_POLICIES

# FP8 widths (multiples of 16) and 2 x 16 = 32 tokens (NVFP4's transform takes 16 at a time).
BENCH_FP8 = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=32)


@pytest.fixture
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("fp8_accumulation.py")


@pytest.fixture
def tiny_preset(monkeypatch: pytest.MonkeyPatch) -> RunPreset:
    monkeypatch.setitem(config.MODEL_SIZES, "bench-fp8", BENCH_FP8)
    preset = RunPreset(name="ci", model="bench-fp8", bench_batch_size=2)
    monkeypatch.setitem(config.PRESETS, "ci", preset)
    return preset


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU emulation's rows")
def test_a_row_per_fp8_precision(
    bench: ModuleType, tiny_preset: RunPreset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bench.main(["--preset", "ci", "--rounds", "1", "--out", str(tmp_path)])
    assert path.name.startswith("fp8_accumulation__")
    record = json.loads(path.read_text())
    meta, rows = record["meta"], record["rows"]
    assert meta["budget_ratio"] == bench.BUDGET == 20 and meta["rounds"] == 1
    assert len(meta["load_average_before"]) == 3 and meta["cpu_threads"] >= 1
    assert [row["precision"] for row in rows] == list(FP8_RECIPE_POLICIES)
    for row in rows:
        assert row["exact_ms"] > 0 and row["hopper_ms"] > 0 and row["batch"] == 2
        assert row["ratio"] == pytest.approx(row["hopper_ms"] / row["exact_ms"])
        assert row["within_budget"] == (row["ratio"] <= 20)
        assert ("note" in row) == (row["precision"] in ("mxfp8", "nvfp4"))
    assert "| fp8-block |" in capsys.readouterr().out


def test_rounds_must_be_positive(bench: ModuleType) -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "0"])
