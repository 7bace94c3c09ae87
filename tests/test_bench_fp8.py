"""Tests for benchmarks/fp8.py, run in-process on tiny sizes into a temporary folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tutorial_lib import config
from tutorial_lib.config import GPTConfig, RunPreset
from tutorial_lib.hardware import te_available

# Widths multiples of 16 (FP8Linear's rule): 1 layer, 2 heads of 8, context 16, vocab 64.
BENCH_TINY = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16)
ON_CPU = not torch.cuda.is_available()
FP8_CPU_NOTE = "CPU: emulation (widen to FP32, FP32 matmul); not an FP8 tensor-core result"


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("fp8.py")


@pytest.fixture(scope="module")
def run(
    bench: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict, dict, str, dict]:
    """One run of main() (tiny sizes, 1 iteration): both records and what it printed.

    The ``ci`` preset is replaced by one on ``BENCH_TINY`` for the run, then restored.
    """
    mp = pytest.MonkeyPatch()
    mp.setitem(config.MODEL_SIZES, "bench-tiny", BENCH_TINY)
    preset = RunPreset(name="ci", model="bench-tiny", batch_size=2, bench_batch_size=2)
    mp.setitem(config.PRESETS, "ci", preset)
    out = tmp_path_factory.mktemp("fp8")
    args = ["--preset", "ci", "--sizes", "16,32", "--tokens", "32", "--iters", "1", "--out"]
    buf = StringIO()
    try:
        with redirect_stdout(buf):
            gemm_path, train_path, recipe_path = bench.main([*args, str(out)])
    finally:
        mp.undo()
    assert gemm_path.parent == out and gemm_path.name.startswith("fp8_gemm__")
    assert train_path.parent == out and train_path.name.startswith("fp8_train__")
    assert gemm_path.with_suffix(".md").is_file() and train_path.with_suffix(".md").is_file()
    load = lambda p: json.loads(p.read_text())  # noqa: E731
    assert recipe_path.name.startswith("fp8_recipe_gemm__")
    return load(gemm_path), load(train_path), buf.getvalue(), load(recipe_path)


def test_gemm_rows(run: tuple[dict, dict, str, dict]) -> None:
    gemm, _, _, _ = run
    assert gemm["benchmark"] == "fp8_gemm" and gemm["environment"]["preset"] == "ci"
    assert gemm["meta"]["tokens"] == 32 and gemm["meta"]["sizes"] == [16, 32]
    assert (gemm["meta"]["warmup"], gemm["meta"]["iters"]) == (1, 1)
    ops = [(row["op"], row["h"]) for row in gemm["rows"]]
    expected_ops = ["bf16 matmul", "fp8 gemm", "fp8 cast"]
    if ON_CPU:
        assert ops == [(op, h) for h in (16, 32) for op in expected_ops]
    for row in gemm["rows"]:
        assert (row["m"], row["n"], row["k"]) == (32, 4 * row["h"], row["h"])
        if "skipped" in row:
            continue
        assert row["time_ms"] > 0 and row["iters"] == 1
        if row["op"] == "fp8 cast":
            assert row["gb_per_s"] > 0
        else:
            assert row["tflops"] > 0
            assert row["tflops"] == pytest.approx(8 * 32 * row["h"] ** 2 / row["time_ms"] / 1e9)


@pytest.mark.skipif(not ON_CPU, reason="the CPU notes")
def test_cpu_rows_say_they_are_cpu_results(run: tuple[dict, dict, str, dict]) -> None:
    gemm, _, _, _ = run
    assert all(row["note"].startswith("CPU:") for row in gemm["rows"])
    fp8 = [row for row in gemm["rows"] if row["op"] == "fp8 gemm"]
    assert fp8 and all(row["note"] == FP8_CPU_NOTE for row in fp8)
    assert all("speedup_vs_bf16" not in row for row in fp8)  # no CPU-vs-CPU FP8 "speedup"


def test_train_rows(run: tuple[dict, dict, str, dict]) -> None:
    _, train, _, _ = run
    assert train["benchmark"] == "fp8_train"
    assert train["meta"]["model_config"]["n_embd"] == 16
    rows = {row["policy"]: row for row in train["rows"]}
    assert list(rows) == ["bf16", "fp8", "te-fp8"]
    for name in ("bf16", "fp8"):
        assert "skipped" not in rows[name] and rows[name]["tokens_per_s"] > 0
    if ON_CPU:
        assert "emulated" in rows["fp8"]["note"]
    if ON_CPU or not te_available()[0]:
        assert rows["te-fp8"]["skipped"]  # not hidden: the row is there, with its reason
        assert "tokens_per_s" not in rows["te-fp8"]


def test_recipe_gemm_rows(run: tuple[dict, dict, str, dict]) -> None:
    """One row per recipe and size; on a CPU each is the emulation and says so; a native row
    (a GPU) agrees with the emulation to BF16 rounding."""
    *_, recipe = run
    assert recipe["benchmark"] == "fp8_recipe_gemm" and recipe["meta"]["recipes"] == [
        "current",
        "rowwise",
        "block",
    ]
    ops = [(row["op"], row["h"]) for row in recipe["rows"]]
    assert ops == [(f"{r} gemm", h) for h in (16, 32) for r in ("current", "rowwise", "block")]
    for row in recipe["rows"]:
        if "skipped" in row:
            assert "cannot run natively" in row["skipped"]
            continue
        assert row["time_ms"] > 0 and row["tflops"] > 0
        if ON_CPU:
            assert row["native"] is False and row["note"].startswith("CPU: emulation")
        if row["native"]:
            assert row["max_rel_diff_vs_emulation"] < 2e-2


def test_tables_are_printed(run: tuple[dict, dict, str, dict]) -> None:
    _, _, out, _ = run
    assert out.count("measured on") == 3
    assert "| op |" in out and "| policy |" in out and "| te-fp8 |" in out


def test_skip_reason(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    assert bench.fp8_skip_reason(torch.device("cpu"), 7, 5) is None  # CPU: runs, with a note
    cuda = torch.device("cuda")
    monkeypatch.setattr(bench, "fp8_gemm_status", lambda d: (False, "GPU is sm_80"))
    assert bench.fp8_skip_reason(cuda, 32, 32) == "GPU is sm_80"
    monkeypatch.setattr(bench, "fp8_gemm_status", lambda d: (True, "ok"))
    assert bench.fp8_skip_reason(cuda, 32, 32) is None
    assert "divisible by 16" in bench.fp8_skip_reason(cuda, 32, 24)


@pytest.mark.parametrize("args", [["--iters", "0"], ["--tokens", "0"], ["--sizes", "0,16"]])
def test_bad_arguments(bench: ModuleType, args: list[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench.main([*args, "--out", str(tmp_path)])
