"""Tests for the ablation ladder (``bench.ladder``), its CLI (``bench --ladder``) and
``benchmarks/fusion.py``."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import matplotlib.pyplot as plt
import pytest
import torch

from tutorial_lib.__main__ import main
from tutorial_lib.bench.fusion_bench import plot_op_bandwidth
from tutorial_lib.bench.ladder import (
    FUSIONS,
    LADDER_MAX_LR,
    RECIPE_FIELDS,
    Rung,
    final_loss,
    format_graph_breaks,
    ladder_meta,
    ladder_rungs,
    ladder_table,
    run_ladder,
    rung_changes,
)
from tutorial_lib.bench.plots import plot_ladder, plot_ladder_losses
from tutorial_lib.build import ModelRecipe
from tutorial_lib.config import PRESETS, GPTConfigOverrides
from tutorial_lib.data import TokenData

# The conftest TINY model at the ci preset's learning rate; 4 steps of 2 sequences.
PRESET = dataclasses.replace(
    PRESETS["ci"],
    model="tiny",
    model_overrides={"block_size": 29, "n_layer": 2, "n_head": 3, "n_embd": 36},
    bench_warmup=1,
)


def test_rungs_and_fusion_choice() -> None:
    for fusion in FUSIONS:
        rungs = ladder_rungs(fusion)
        assert [r.precision for r in rungs] == [
            "fp32",
            "tf32",
            "bf16",
            "bf16",
            "fp8",
            "fp8",
            "te-fp8-fused",
        ]
        assert rungs[3].compile == rungs[4].compile == (fusion in ("compile", "both"))
        assert rungs[3].fused == rungs[4].fused == (fusion in ("triton", "both"))
        assert not any(r.fused or r.compile for r in rungs[:3] + rungs[5:])
        assert [r.name[0] for r in rungs] == [str(i) for i in range(1, 8)]
    with pytest.raises(ValueError, match="fusion must be one of"):
        ladder_rungs("xla")


@pytest.mark.parametrize("fusion", FUSIONS)
def test_neighbouring_rungs_differ_in_exactly_one_recipe_field(fusion: str) -> None:
    # The fields compared are the ones build_model records on the model.
    assert set(RECIPE_FIELDS) <= {f.name for f in dataclasses.fields(ModelRecipe)}
    rungs = ladder_rungs(fusion)
    changes = [rung_changes(lower, upper) for lower, upper in itertools.pairwise(rungs)]
    fusion_steps = {3: (False, True), 5: (True, False)}  # rung 4 adds the fusion, rung 6 drops it
    for i, change in enumerate(changes, start=1):
        if i in fusion_steps and fusion == "both":  # one choice that turns two switches
            assert change == {"fused": fusion_steps[i], "compile": fusion_steps[i]}
        else:
            assert len(change) == 1, (rungs[i].name, change)
    assert list(changes[5]) == ["precision"]  # TE (rung 7) against our FP8, both unfused
    assert rung_changes(rungs[0], rungs[0]) == {}


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


# FP8 needs widths that are multiples of 16 and token counts that are multiples of 8.
FP8_OVERRIDES: GPTConfigOverrides = {"block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32}
FP8_PRESET = dataclasses.replace(PRESET, model_overrides=FP8_OVERRIDES)


@pytest.fixture
def dynamo_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Module.compile`` with the ``eager`` backend: Dynamo traces (and breaks graphs) as
    with Inductor, but nothing is code-generated, so a compiled rung takes seconds."""
    compile_module = torch.nn.Module.compile

    def compile_eager(self: torch.nn.Module, *args: object, **kwargs: object) -> None:
        compile_module(self, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(torch.nn.Module, "compile", compile_eager)


def test_compiled_rungs_record_their_graph_breaks(
    dynamo_only: None, data_factory: Callable[..., TokenData]
) -> None:
    rungs = [
        Rung("fp32 compiled", "fp32", compile=True),
        Rung("fp8 compiled", "fp8", compile=True),
        Rung("fp8 eager", "fp8"),
    ]
    data = data_factory(block_size=16)
    rows = run_ladder(FP8_PRESET, "cpu", rungs, steps=2, batch=2, data=data, progress=False)
    clean, fp8, eager = rows
    assert clean["graph_breaks"] == 0 and clean["graphs"] >= 1 and clean["graph_break_sites"] == {}
    # FP8Linear.forward is wrapped in torch.compiler.disable: a known break at every call site.
    assert fp8["graph_breaks"] >= 1 and fp8["graphs"] > clean["graphs"]
    assert all("FP8Linear.forward" in why for why in fp8["graph_break_reasons"])
    assert sum(fp8["graph_break_reasons"].values()) == fp8["graph_breaks"]
    assert any("self.qkv(x)" in site for site in fp8["graph_break_sites"])
    assert "graph_breaks" not in eager  # not compiled: nothing to count
    table = ladder_table(rows)
    assert [t["graph breaks"] for t in table] == [0, fp8["graph_breaks"], None]
    text = format_graph_breaks(fp8)
    assert f"{fp8['graph_breaks']} graph break(s)" in text and "FP8Linear.forward" in text
    assert "not compiled" in format_graph_breaks(eager)
    meta = ladder_meta(FP8_PRESET, rows)["graph_breaks"]
    assert set(meta) == {"fp32 compiled", "fp8 compiled"}  # what a results file records
    assert meta["fp8 compiled"]["graph_break_sites"] == fp8["graph_break_sites"]
    # Another run compiles from scratch (Dynamo is reset): a model twice as deep counts the same
    # breaks, since identical blocks share one compiled frame.
    deeper = dataclasses.replace(FP8_PRESET, model_overrides={**FP8_OVERRIDES, "n_layer": 2})
    again = run_ladder(deeper, "cpu", rungs[1:2], steps=1, batch=2, data=data, progress=False)
    assert again[0]["graph_breaks"] == fp8["graph_breaks"]
    assert again[0]["graph_break_sites"] == fp8["graph_break_sites"]
    assert fp8["frames_run_eagerly"] >= 1  # the break inside GPT.forward's loop over blocks
    # count_breaks=False (chapter 7's step rows) keeps Dynamo's cache: no reset, no count.
    reused = run_ladder(
        deeper, "cpu", rungs[1:2], steps=1, batch=2, data=data, progress=False, count_breaks=False
    )
    assert "graph_breaks" not in reused[0] and reused[0]["compile"]


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
            "1,2,7",
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
    assert [r["rung"] for r in record["rows"]] == ["1 fp32 eager", "2 tf32", "7 TE fused fp8"]
    assert len(record["meta"]["losses"]["1 fp32 eager"]) == 2
    assert record["meta"]["lr"] == 5e-4
    assert record["environment"]["preset"] == "ci"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench"], "Choose a benchmark: --ladder"),
        (["bench", "--ladder", "--rungs", "0,2"], "rung numbers run from 1 to 7"),
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
