"""Tests for benchmarks/precision.py, run in-process on a tiny model into a temporary folder."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tutorial_lib import config
from tutorial_lib.config import GPTConfig, RunPreset
from tutorial_lib.precision import available_policies

# 1 layer, 2 heads of 7, context 11, vocab 61: a step takes milliseconds even in BF16 on a CPU.
BENCH_TINY = GPTConfig(vocab_size=61, block_size=11, n_layer=1, n_head=2, n_embd=14)
STAMP_KEYS = {
    "date",
    "device",
    "device_summary",
    "compute_capability",
    "torch",
    "cuda",
    "driver",
    "triton",
    "python",
    "platform",
    "preset",
}
ON_CPU = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("precision.py")


@pytest.fixture
def tiny_preset(monkeypatch: pytest.MonkeyPatch) -> RunPreset:
    """Replace the ``ci`` preset by one on ``BENCH_TINY`` (restored after the test)."""
    monkeypatch.setitem(config.MODEL_SIZES, "bench-tiny", BENCH_TINY)
    preset = RunPreset(
        name="ci",
        model="bench-tiny",
        batch_size=3,
        bench_batch_size=3,
        bench_warmup=2,
        bench_iters=3,
    )
    monkeypatch.setitem(config.PRESETS, "ci", preset)
    return preset


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_all_policies_one_row_each(
    bench: ModuleType, tiny_preset: RunPreset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bench.main(["--preset", "ci", "--steps", "1", "--out", str(tmp_path)])
    assert path.parent == tmp_path and path.name.startswith("precision__")
    record = _load(path)
    assert record["benchmark"] == "precision"
    assert STAMP_KEYS <= set(record["environment"]) and record["environment"]["preset"] == "ci"
    assert record["meta"]["model_config"] == dataclasses.asdict(BENCH_TINY)
    assert (record["meta"]["warmup"], record["meta"]["iters"]) == (1, 1)
    rows = {row["policy"]: row for row in record["rows"]}
    assert list(rows) == available_policies() and len(record["rows"]) == len(rows)
    for row in rows.values():
        assert (row["model"], row["batch"], row["seq"]) == ("bench-tiny", 3, 11)
        if "skipped" in row:
            continue
        assert row["tokens_per_s"] > 0 and row["iters"] == 1
        assert row["step_time_min_ms"] <= row["step_time_ms"] <= row["step_time_max_ms"]
        assert row["tokens_per_s"] == pytest.approx(3 * 11 / (row["step_time_ms"] / 1e3))
        assert row["peak_rss_bytes"] > 0
        if ON_CPU:
            assert row["mfu"] is None  # no datasheet peak for a CPU: never invented
            assert row["peak_allocated_bytes"] is None and row["peak_reserved_bytes"] is None
    out = capsys.readouterr().out
    assert "measured on" in out and "| policy |" in out
    assert all(f"| {name} |" in out for name in rows)
    assert path.with_suffix(".md").is_file()


@pytest.mark.skipif(not ON_CPU, reason="the CPU-specific skip and notes")
def test_cpu_skips_fp16_with_a_reason(
    bench: ModuleType, tiny_preset: RunPreset, tmp_path: Path
) -> None:
    path = bench.main(["--policies", "fp16,fp32,tf32", "--steps", "1", "--out", str(tmp_path)])
    rows = {row["policy"]: row for row in _load(path)["rows"]}
    assert list(rows) == ["fp16", "fp32", "tf32"]
    assert "CUDA" in rows["fp16"]["skipped"] and "step_time_ms" not in rows["fp16"]
    assert "skipped" not in rows["fp32"] and "note" not in rows["fp32"]
    assert "FP32" in rows["tf32"]["note"]  # TF32 does nothing on a CPU, and the row says so


def test_model_batch_and_steps_overrides(
    bench: ModuleType, tiny_preset: RunPreset, tmp_path: Path
) -> None:
    path = bench.main(
        [
            "--preset",
            "hopper",
            "--model",
            "bench-tiny",
            "--batch",
            "2",
            "--steps",
            "2",
            "--policies",
            "fp32",
            "--out",
            str(tmp_path),
        ]
    )
    record = _load(path)
    assert record["environment"]["preset"] == "hopper"  # the preset used, not the env's
    assert record["meta"]["model_config"]["vocab_size"] == 50304  # hopper's BPE rows kept
    assert (record["meta"]["warmup"], record["meta"]["iters"]) == (2, 2)
    [row] = record["rows"]
    assert (row["policy"], row["model"], row["batch"], row["seq"]) == ("fp32", "bench-tiny", 2, 11)
    assert row["iters"] == 2 and row["tokens_per_s"] > 0


def test_steps_must_be_positive(bench: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--steps", "0", "--out", str(tmp_path)])


def test_unknown_policy_is_an_error(
    bench: ModuleType, tiny_preset: RunPreset, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="Unknown precision policy"):
        bench.main(["--policies", "fp33", "--steps", "1", "--out", str(tmp_path)])


def test_the_step_trains(bench: ModuleType) -> None:
    """The timed step is a real optimizer step: the weights move."""
    from tutorial_lib.bench import make_step
    from tutorial_lib.precision import get_policy

    step, model = make_step(get_policy("fp32"), BENCH_TINY, 2, torch.device("cpu"))
    before = [p.detach().clone() for p in model.parameters()]
    step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
