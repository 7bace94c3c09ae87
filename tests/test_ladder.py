"""Tests for the ablation ladder (``bench.ladder``), its CLI (``bench --ladder``) and
``benchmarks/fusion.py``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import matplotlib.pyplot as plt
import pytest

from tutorial_lib.__main__ import main
from tutorial_lib.bench.fusion_bench import plot_op_bandwidth
from tutorial_lib.bench.ladder import (
    FUSIONS,
    LADDER_MAX_LR,
    Rung,
    final_loss,
    ladder_rungs,
    ladder_table,
    plot_ladder,
    plot_ladder_losses,
    run_ladder,
)
from tutorial_lib.config import PRESETS
from tutorial_lib.data import TokenData

# The conftest TINY model at the ci preset's learning rate; 4 steps of 2 sequences.
PRESET = dataclasses.replace(
    PRESETS["ci"],
    model="tiny",
    model_overrides={"block_size": 29, "n_layer": 2, "n_head": 3, "n_embd": 36},
    bench_warmup=1,
)


def test_rungs_are_cumulative_and_fusion_is_chosen() -> None:
    for fusion in FUSIONS:
        rungs = ladder_rungs(fusion)
        assert [r.precision for r in rungs] == [
            "fp32",
            "tf32",
            "bf16",
            "bf16",
            "fp8",
            "te-fp8-fused",
        ]
        assert rungs[3].compile == rungs[4].compile == (fusion in ("compile", "both"))
        assert rungs[3].fused == rungs[4].fused == (fusion in ("triton", "both"))
        assert not any(r.fused or r.compile for r in rungs[:3])
    with pytest.raises(ValueError, match="fusion must be one of"):
        ladder_rungs("xla")


def test_final_loss_averages_the_last_fifth() -> None:
    assert final_loss([9.0] * 5 + [1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(4.5)
    assert final_loss([3.0]) == 3.0


@pytest.fixture(scope="module")
def rows(data_factory: Callable[..., TokenData]) -> list[dict]:
    rungs = [
        Rung("fp32", "fp32"),
        Rung("tf32", "tf32"),
        Rung("fused", "fp32", fused=True),
        Rung("te", "te-fp8-fused"),
    ]
    return run_ladder(PRESET, "cpu", rungs, steps=4, batch=2, data=data_factory(), progress=False)


def test_ladder_runs_every_rung_on_the_same_batches(rows: list[dict]) -> None:
    fp32, tf32, fused, te = rows
    assert fp32["steps"] == 4 and len(fp32["losses"]) == 4 and fp32["seq"] == 29
    assert fp32["lr"] == min(PRESET.lr, LADDER_MAX_LR) == 1e-3  # capped for stable parity
    # On a CPU TF32 is FP32 math: the same batches give the same losses, bit for bit.
    assert tf32["losses"] == fp32["losses"]
    assert "CUDA" in tf32["note"]
    assert fused["losses"] == pytest.approx(fp32["losses"], abs=1e-4)
    assert fused["fused"] is True and "interpreter" in fused["note"]
    assert fp32["tokens_per_s"] == pytest.approx(2 * 29 / (fp32["step_time_ms"] / 1e3))
    assert fp32["compile_s"] is None and fp32["mfu"] is None  # a CPU has no spec-table peak
    assert "skipped" in te and "te-fp8-fused" in te["skipped"]


def test_table_and_figures(rows: list[dict]) -> None:
    table = ladder_table(rows)
    assert table[0]["speed-up"] == 1.0 and table[0]["vs rung 1"] == 0.0
    assert table[1]["vs rung 1"] == 0.0
    assert table[3] == {"rung": "te", "skipped": rows[3]["skipped"]}
    fig = plot_ladder(rows, hardware="test CPU")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("skipped" in t for t in texts) and any("n/a" in t for t in texts)  # MFU on CPU
    fig2 = plot_ladder_losses(rows)
    assert len(fig2.axes[0].lines) == 3  # the skipped rung draws no curve
    plt.close("all")


def test_cli_bench_ladder_writes_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tutorial_lib.config.PRESETS", {**PRESETS, "ci": PRESET})
    code = main(
        [
            "bench",
            "--ladder",
            "--preset",
            "ci",
            "--rungs",
            "1,2,6",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--lr",
            "5e-4",
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "1 fp32 eager" in out and "2 tf32" in out and "skipped" in out
    (path,) = tmp_path.glob("ladder__*__ci__*.json")
    record = json.loads(path.read_text())
    assert [r["rung"] for r in record["rows"]] == ["1 fp32 eager", "2 tf32", "6 TE fused fp8"]
    assert len(record["meta"]["losses"]["1 fp32 eager"]) == 2
    assert record["meta"]["lr"] == 5e-4
    assert record["environment"]["preset"] == "ci"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench"], "Choose a benchmark: --ladder"),
        (["bench", "--ladder", "--rungs", "0,2"], "rung numbers run from 1 to 6"),
        (["bench", "--ladder", "--rungs", "one"], "comma-separated numbers"),
    ],
)
def test_cli_bench_errors_are_clear(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_fusion_benchmark_records_ops_and_steps(
    load_benchmark: Callable[[str], ModuleType],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bench = load_benchmark("fusion.py")
    monkeypatch.setattr(bench, "get_preset", lambda name=None: PRESET)
    path = bench.main(["--iters", "1", "--steps", "2", "--out", str(tmp_path)])
    record = json.loads(path.read_text())
    ops = [r for r in record["rows"] if r["op"] != "training step"]
    assert {r["op"] for r in ops} == {
        "bias + GELU",
        "LayerNorm",
        "residual add + LayerNorm",
        "softmax",
        "cross-entropy",
    }
    for r in ops:
        if r["impl"] == "triton":  # no GPU here: said, not timed
            assert "CUDA GPU only" in r["skipped"]
        else:
            assert r["time_us"] > 0 and r["GB/s"] > 0 and r["fraction_of_hbm_peak"] is None
    _, ax = plt.subplots()
    plot_op_bandwidth(ax, ops, "ops")
    assert [t.get_text() for t in ax.texts].count("GPU\nonly") == 5  # triton, not timed here
    assert len(ax.patches) == 15
    plt.close("all")
    steps = [r for r in record["rows"] if r["op"] == "training step"]
    assert [r["rung"] for r in steps] == ["eager", "compile"]
    assert steps[1]["compile_s"] is not None
    assert record["meta"]["triton"].startswith("Triton")
