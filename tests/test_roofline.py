"""Tests for FLOP counting against the model's formula, and for the roofline model."""

from __future__ import annotations

import dataclasses
import datetime as dt

import matplotlib.pyplot as plt
import pytest
import torch

from tutorial_lib.config import GPTConfig
from tutorial_lib.hardware import SPECS
from tutorial_lib.model import GPT
from tutorial_lib.perf import (
    Op,
    elementwise,
    flops_by_op,
    gemm,
    measure_cpu_roof,
    model_ops,
    plot_roofline,
    roof_from_spec,
    train_step_flops,
)
from tutorial_lib.perf.roofline import Roof

# Nothing here is a power of two: vocab 97, context 37, 3 layers, 5 heads of 8.
ODD = GPTConfig(vocab_size=97, block_size=37, n_layer=3, n_head=5, n_embd=40)
B = 3

# ---- FLOP counter vs the analytic formula --------------------------------------------------


def _model_and_batch(cfg: GPTConfig, T: int) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(cfg)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(cfg.vocab_size, (B, T), generator=g)
    targets = torch.randint(cfg.vocab_size, (B, T), generator=g)
    return model, idx, targets


@pytest.mark.parametrize(("T", "bias"), [(37, True), (20, True), (37, False)])
def test_train_step_flops_equals_the_formula_exactly(T: int, bias: bool) -> None:
    """6N + 12LTC per token, attention over the full T x T: exact, no tolerance."""
    model, idx, targets = _model_and_batch(dataclasses.replace(ODD, bias=bias), T)
    expected = 3 * B * T * model.flops_per_token(training=False, seq_len=T)
    assert train_step_flops(model, idx, targets) == expected
    assert all(p.grad is None for p in model.parameters())  # zeroed afterwards


def test_forward_count_equals_the_formula_exactly() -> None:
    model, idx, _ = _model_and_batch(ODD, 37)
    with torch.no_grad():
        counted = sum(flops_by_op(lambda: model(idx)).values())
    assert counted == B * 37 * model.flops_per_token(training=False, seq_len=37)


def test_flash_backward_counts_the_recomputed_scores() -> None:
    """The default (flash) SDPA kernel's backward recomputes Q K^T: torch counts 5 matmuls where
    the model-FLOPs formula has 4, i.e. 2 B T^2 C more per layer than 3x the forward."""
    model, idx, targets = _model_and_batch(ODD, 37)
    counted = sum(flops_by_op(lambda: model(idx, targets)[1].backward()).values())
    formula = 3 * B * 37 * model.flops_per_token(training=False, seq_len=37)
    assert counted == formula + 2 * B * ODD.n_layer * 37**2 * ODD.n_embd


def test_flops_by_op_splits_the_total() -> None:
    model, idx, targets = _model_and_batch(ODD, 37)
    by_op = flops_by_op(lambda: model(idx, targets)[1].backward())
    assert {"aten.mm", "aten.addmm"} <= set(by_op)
    # Forward Linear layers with bias run as addmm: 2 x 12 L C^2 per token.
    assert by_op["aten.addmm"] == 2 * B * 37 * 12 * ODD.n_layer * ODD.n_embd**2
    assert all(v > 0 for v in by_op.values())


def test_flops_of_an_odd_matmul() -> None:
    a, b = torch.randn(5, 123), torch.randn(123, 7)
    assert flops_by_op(lambda: a @ b) == {"aten.mm": 2 * 5 * 123 * 7}
    assert flops_by_op(lambda: torch.relu(a)) == {}  # elementwise ops count zero


# ---- Op, gemm, elementwise -----------------------------------------------------------------


def test_gemm_counts_odd_shapes() -> None:
    op = gemm(5, 123, 7, dtype_bytes=4)
    assert op.flops == 2 * 5 * 123 * 7 == 8610
    assert op.bytes == (5 * 7 + 7 * 123 + 5 * 123) * 4 == 6044
    assert op.intensity == pytest.approx(8610 / 6044)
    assert op.name == "GEMM 5x123x7"
    assert gemm(2, 3, 4, name="qkv").name == "qkv"


def test_elementwise_counts() -> None:
    add = elementwise(1000, reads=2, writes=1, dtype_bytes=2, name="add")
    assert (add.flops, add.bytes) == (1000.0, 6000.0)
    assert add.intensity == pytest.approx(1 / 6)
    gelu = elementwise(333, flops_per_element=10, dtype_bytes=4)
    assert (gelu.flops, gelu.bytes) == (3330.0, 333 * 8.0)


# ---- Roof ----------------------------------------------------------------------------------

H100 = roof_from_spec(SPECS["H100 SXM"], "bf16")


def test_h100_bf16_roof_and_ridge() -> None:
    assert (H100.peak_flops, H100.bandwidth) == (989.5e12, 3.35e12)
    assert H100.ridge == pytest.approx(295.37, abs=0.01)  # 989.5e12 / 3.35e12 FLOP/B
    assert "datasheet" in H100.source
    assert roof_from_spec(SPECS["H200"], "bf16").ridge == pytest.approx(989.5 / 4.8)


def test_big_bf16_gemm_is_compute_bound_on_h100() -> None:
    op = gemm(4096, 4096, 4096)
    assert op.intensity == pytest.approx(4096 / 3)  # 2n^3 / (3 n^2 x 2 bytes)
    assert H100.bound(op) == "compute"
    assert H100.time(op) == pytest.approx(2 * 4096**3 / 989.5e12)  # about 139 us
    assert H100.attainable(op.intensity) == H100.peak_flops


def test_bf16_add_is_memory_bound_on_h100() -> None:
    op = elementwise(4096 * 4096, reads=2, writes=1, dtype_bytes=2)
    assert H100.bound(op) == "memory"
    assert H100.time(op) == op.bytes / H100.bandwidth  # 3 x 32 MiB at 3.35 TB/s: about 30 us
    assert H100.attainable(op.intensity) == pytest.approx(op.intensity * 3.35e12)


def test_small_gemm_is_memory_bound() -> None:
    op = gemm(64, 64, 64)  # intensity 64/3 = 21 FLOP/B, far below the ridge
    assert H100.bound(op) == "memory"
    assert H100.time(op) == pytest.approx(op.bytes / 3.35e12)


def test_roof_from_spec_names_the_missing_dtype() -> None:
    with pytest.raises(ValueError, match="fp8"):
        roof_from_spec(SPECS["A100"], "fp8")
    with pytest.raises(ValueError, match="int4"):
        roof_from_spec(SPECS["H100 SXM"], "int4")


def test_measure_cpu_roof_is_a_labelled_measurement() -> None:
    roof = measure_cpu_roof(n=96, copy_bytes=2**22, iters=2)
    assert roof.peak_flops > 1e6 and roof.bandwidth > 1e6
    assert roof.source.startswith("measured on ")
    assert roof.source.endswith(dt.datetime.now(dt.timezone.utc).date().isoformat())
    assert "measured" in roof.name
    assert roof.ridge == roof.peak_flops / roof.bandwidth


# ---- model_ops -----------------------------------------------------------------------------


def test_model_ops_agree_with_the_model_formula() -> None:
    ops = {op.name: op for op in model_ops(ODD, batch=B, dtype_bytes=2)}
    M, T, C, V = B * ODD.block_size, ODD.block_size, ODD.n_embd, ODD.vocab_size
    layer_matmuls = [
        "QKV projection",
        "attention scores Q K^T",
        "attention P V",
        "attention out-projection",
        "MLP fc",
        "MLP proj",
    ]
    per_layer = sum(ops[n].flops for n in layer_matmuls)
    fwd = GPT(ODD).flops_per_token(training=False, seq_len=T)
    assert per_layer * ODD.n_layer + ops["LM head"].flops == M * fwd
    assert ops["QKV projection"].flops == 2 * M * 3 * C * C
    assert ops["QKV projection"].bytes == (M * C + C * 3 * C + M * 3 * C) * 2
    assert ops["softmax"].bytes == B * ODD.n_head * T * T * 2 * 2  # read + write the scores
    assert ops["residual add (x2)"].bytes == 2 * M * C * 3 * 2
    assert ops["LM head"] == gemm(M, V, C, 2, name="LM head")


def test_model_ops_scale_with_dtype_bytes() -> None:
    two = model_ops(ODD, batch=B, dtype_bytes=2)
    four = model_ops(ODD, batch=B, dtype_bytes=4)
    for a, b in zip(two, four, strict=True):
        assert a.name == b.name and a.flops == b.flops and b.bytes == 2 * a.bytes


def test_model_ops_elementwise_are_memory_bound_on_h100() -> None:
    ops = {op.name: op for op in model_ops(GPTConfig.from_name("gpt2-124m"), batch=8)}
    for name in ("softmax", "GELU", "LayerNorm (x2)", "residual add (x2)"):
        assert H100.bound(ops[name]) == "memory", name
    assert H100.bound(ops["MLP fc"]) == "compute"


# ---- plot_roofline -------------------------------------------------------------------------


def test_plot_roofline() -> None:
    cpu = Roof("test CPU", 1e11, 2e10, "made up for a test")
    ops = [gemm(512, 512, 512, name="big GEMM"), elementwise(10**6, reads=2, name="add")]
    fig = plot_roofline([H100, cpu], ops, title="Roofline test")
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_title() == "Roofline test"
    assert ax.get_xlabel() == "arithmetic intensity (FLOP/byte)"
    assert ax.get_ylabel() == "attainable FLOP/s"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) == 2 and legend[0].startswith(H100.name) and "test CPU" in legend[1]
    assert {t.get_text() for t in ax.texts} >= {"big GEMM", "add"}
    points = [line for line in ax.lines if len(line.get_xdata()) == 1]
    assert [p.get_ydata()[0] for p in points] == [H100.attainable(op.intensity) for op in ops]
    plt.close(fig)


def test_plot_roofline_needs_a_roof() -> None:
    with pytest.raises(ValueError, match="Roof"):
        plot_roofline([], [Op("x", 1.0, 1.0)])
