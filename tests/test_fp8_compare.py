"""``fp8.compare``: the error measures against hand-made cases, storage sizes, and the rows and
loss curves the recipes chapter plots."""

from __future__ import annotations

import math

import pytest
import torch

from tutorial_lib.bench import loss_curves, recipe_runs
from tutorial_lib.config import GPTConfig
from tutorial_lib.fp8 import get_quantizer
from tutorial_lib.fp8.compare import (
    COMPARED_RECIPES,
    compare_recipes,
    quant_error,
    quantized_bytes,
)


def test_quant_error_counts_underflow_and_clipping() -> None:
    x = torch.tensor([[1e-12, 1.0, 100.0, 1000.0]])
    q = get_quantizer("delayed", "input", scale=1.0).quantize(x)  # max 448: 1000 clips
    stats = quant_error(x, q)
    assert stats["underflow"] == pytest.approx(1 / 4)  # 1e-12 is below E4M3's smallest
    assert stats["clipped"] == pytest.approx(1 / 4)
    # E4M3 keeps 1.0, rounds 100 to 96 (a tie, to even) and clips 1000 to 448
    expected = math.sqrt(1e-24 + 4.0**2 + 552.0**2) / math.sqrt(1e-24 + 1 + 1e4 + 1e6)
    assert stats["rel_rmse"] == pytest.approx(expected, rel=1e-9)
    assert stats["snr_db"] == pytest.approx(-20 * math.log10(expected), rel=1e-9)
    assert stats["row_snr_db"] == pytest.approx(stats["snr_db"], rel=1e-9)  # one row


def test_row_snr_is_the_typical_token_not_the_outliers() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 128)
    x[::32] *= 1e4  # two outlier tokens dominate the total signal
    per_tensor = quant_error(x, get_quantizer("current", "input").quantize(x))
    per_row = quant_error(x, get_quantizer("rowwise", "input").quantize(x))
    assert abs(per_tensor["snr_db"] - per_row["snr_db"]) < 1  # the outliers' SNR: alike
    assert per_row["row_snr_db"] - per_tensor["row_snr_db"] > 2  # ordinary tokens: not
    exact = get_quantizer("current", "input").quantize(torch.tensor([[0.0, 448.0]]))
    assert quant_error(torch.tensor([[0.0, 448.0]]), exact)["snr_db"] == math.inf


def test_quantized_bytes_per_recipe() -> None:
    x = torch.randn(40, 200)  # odd sizes: partial tiles
    sizes = {
        r: quantized_bytes(get_quantizer(r, "input").quantize(x))
        for r in ("current", "block", "mxfp8", "nvfp4", "rowwise")
    }
    assert sizes["current"] == {"payload": 8000, "scales": 4, "total": 8004}
    assert sizes["rowwise"]["scales"] == 40 * 4
    assert sizes["block"]["scales"] == 40 * math.ceil(200 / 128) * 4
    assert sizes["mxfp8"]["scales"] == 40 * math.ceil(200 / 32)
    assert sizes["nvfp4"] == {
        "payload": 4000,
        "scales": 40 * math.ceil(200 / 16) + 4,
        "total": 4000 + 520 + 4,
    }


def test_compare_recipes_rows_and_delayed_history() -> None:
    torch.manual_seed(0)
    now = {"fc": {"input": torch.randn(32, 64), "grad_output": torch.randn(32, 16) * 1e-3}}
    before = {"fc": {"input": now["fc"]["input"] * 4, "grad_output": now["fc"]["grad_output"]}}
    rows = compare_recipes(now, previous=[before])
    assert len(rows) == 2 * len(COMPARED_RECIPES)
    by = {(r["role"], r["recipe"]): r for r in rows}
    # a stale, 4x larger amax wastes two binades: delayed is worse than current on the input
    assert by[("input", "delayed")]["rel_rmse"] > by[("input", "current")]["rel_rmse"]
    same = compare_recipes(now, recipes=("delayed", "current"))  # no history: its own amax
    assert same[0]["rel_rmse"] == same[1]["rel_rmse"]
    assert by[("input", "nvfp4")]["bytes_per_element"] < by[("input", "block")]["bytes_per_element"]


def test_recipe_runs_start_from_the_same_weights_and_batches() -> None:
    cfg = GPTConfig(vocab_size=256, block_size=16, n_layer=1, n_head=2, n_embd=32)
    names: list[str] = []
    runs = recipe_runs(cfg, 3, recipes=("current", "nvfp4"), batch_size=2, progress=names.append)
    assert names == ["bf16", "fp8-current", "nvfp4"] and list(runs) == names
    curves = loss_curves(runs)
    assert all(len(c) == 3 for c in curves.values())
    first = [c[0] for c in curves.values()]  # same weights and batch: the first losses agree
    assert max(first) - min(first) < 0.05
    assert max(first) - min(first) > 0  # but each ran its own precision


def test_compare_quantizes_as_training_does() -> None:
    """Gradients under HYBRID recipes are E5M2; the E4M3 control and the tiled recipes use E4M3;
    NVFP4's gradients are rounded stochastically (seeded)."""
    torch.manual_seed(0)
    tensors = {"fc": {"grad_output": torch.randn(64, 128)}}
    rows = compare_recipes(tensors, recipes=("current", "current-e4m3", "block", "nvfp4"))
    by = {r["recipe"]: r for r in rows}
    # E4M3 keeps one more mantissa bit than E5M2: about 6 dB
    assert by["current-e4m3"]["snr_db"] - by["current"]["snr_db"] > 4.5
    assert abs(by["current-e4m3"]["snr_db"] - by["block"]["snr_db"]) < 1.0  # a narrow tensor
    again = compare_recipes(tensors, recipes=("nvfp4",), seed=0)[0]
    other = compare_recipes(tensors, recipes=("nvfp4",), seed=1)[0]
    assert again["rel_rmse"] == by["nvfp4"]["rel_rmse"] != other["rel_rmse"]
