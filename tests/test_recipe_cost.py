"""Tests for the per-recipe roofline cost model (``tutorial_lib.bench.recipe_cost``).

Hand-computed byte counts use M = 200 tokens, K = 48 in, N = 40 out, so that the tiles do not
divide the sides: x has 9600 elements, w 1920, dy 8000.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import matplotlib

matplotlib.use("Agg")

import matplotlib as mpl  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from tutorial_lib.bench.plots import plot_recipe_costs  # noqa: E402
from tutorial_lib.bench.recipe_cost import (  # noqa: E402
    COST_RECIPES,
    CopyBytes,
    _copy,
    quantized_tensors,
    recipe_cost_table,
    recipe_layer_cost,
    recipe_memory_bytes,
)
from tutorial_lib.fp8.recipes import RECIPES  # noqa: E402
from tutorial_lib.hardware import SPECS, DeviceSpec  # noqa: E402

M, K, N = 200, 48, 40
HOPPER, BLACKWELL = (9, 0), (10, 0)


@pytest.fixture(autouse=True)
def isolated_style() -> Iterator[None]:
    with mpl.rc_context():
        yield
    plt.close("all")


# (cast bytes, scale bytes) on Hopper, summed over x, w, dy; worked out in the comments.
HAND_CAST = {
    # x: 2*9600 read + (9600 + 4) + 9600 written = 38404; w: 3840 + 1924 + 1920 = 7684;
    # dy: 16000 + 8004 + 8000 = 32004.
    "delayed": (78092, 12),
    # as delayed plus a second read of each tensor (amax): + 2 * (9600 + 1920 + 8000).
    "current": (117132, 12),
    # x: 19200 + 9600 + 4*200*1 + 9600 + 4*48*ceil(200/128)=384 -> 39584; w (128x128):
    # 3840 + 1920 + 4 + 1920 + 4 = 7688; dy: 16000 + 8000 + 800 + 8000 + 4*40*2 = 33120.
    "block": (80392, 800 + 384 + 4 + 4 + 800 + 320),
    # x: 19200 + 9600 + 200*ceil(48/32)=400 + 9600 + 48*ceil(200/32)=336 -> 39136;
    # w: 3840 + 1920 + 40*2 + 1920 + 48*2 = 7856; dy: 16000 + 8000 + 400 + 8000 + 40*7 = 32680.
    "mxfp8": (79672, 400 + 336 + 80 + 96 + 400 + 280),
    # x (3 reads): 57600 + 200*24 + (200*3 + 4) + 48*100 + (48*ceil(200/16) + 4) = 68432;
    # w (2 reads): 7680 + 960 + 124 + 960 + (48*3 + 4) = 9872;
    # dy (3 reads): 48000 + 4000 + 604 + 4000 + (40*13 + 4) = 57128.
    "nvfp4": (135432, 604 + 628 + 124 + 148 + 604 + 524),
    # two reads (one per copy); x: 38400 + 9600 + 4*200 + 9600 + 4*48 = 58592;
    # w: 7680 + 1920 + 160 + 1920 + 192 = 11872; dy: 32000 + 8000 + 800 + 8000 + 160 = 48960.
    "rowwise": (119424, 800 + 192 + 160 + 192 + 800 + 160),
}


@pytest.mark.parametrize("recipe", list(HAND_CAST))
def test_cast_and_scale_bytes_by_hand(recipe: str) -> None:
    cost = recipe_layer_cost(SPECS["H100 SXM"], recipe, M, K, N)
    assert (cost.cast_bytes, cost.scale_bytes) == HAND_CAST[recipe]
    tensors = quantized_tensors(recipe, M, K, N)
    assert sum(t.cast_bytes for t in tensors) == HAND_CAST[recipe][0]


def test_blackwell_per_tensor_fp8_needs_no_transposed_copy() -> None:
    """sm_100 FP8 GEMMs take any layout: x, w, dy written once (58572 = 78092 - 19520)."""
    for recipe in ("delayed", "current"):
        hopper = recipe_layer_cost(SPECS["H100 SXM"], recipe, M, K, N)
        blackwell = recipe_layer_cost(SPECS["B200"], recipe, M, K, N)
        assert hopper.cast_bytes - blackwell.cast_bytes == 9600 + 1920 + 8000
    assert recipe_layer_cost(SPECS["B200"], "delayed", M, K, N).cast_bytes == 58572
    # The tiled recipes write both copies on every GPU.
    for recipe in ("block", "mxfp8", "nvfp4", "rowwise"):
        assert recipe_layer_cost(SPECS["B200"], recipe, M, K, N).cast_bytes == HAND_CAST[recipe][0]


def test_odd_sides_round_up() -> None:
    """Partial tiles and an odd count of FP4 elements round up (ceil), never down."""
    assert _copy("nvfp4", "input", 3, 33) == CopyBytes(3 * 17, 3 * 3 + 4)
    assert _copy("mxfp8", "input", 3, 33) == CopyBytes(99, 3 * 2)
    assert _copy("block", "weight", 129, 1) == CopyBytes(129, 4 * 2)
    assert _copy("block", "input", 129, 129) == CopyBytes(129 * 129, 4 * 129 * 2)


def test_memory_saved_for_backward_by_hand() -> None:
    """(activation, weight_copy): BF16 saves x (2 bytes each) and reuses the weight parameter;
    the recipes save x^T (48 x 200) and w^T (48 x 40), column-wise copies with their scales."""
    expected = {
        "bf16": (2 * 9600, 0),
        "delayed": (9600 + 4, 1920 + 4),  # one fp32 scale_inv per tensor
        "current": (9600 + 4, 1920 + 4),
        "block": (9600 + 4 * 48 * 2, 1920 + 4 * 1 * 1),  # x 1x128 tiles, w one 128x128 tile
        "mxfp8": (9600 + 48 * 7, 1920 + 48 * 2),  # ceil(200/32) = 7, ceil(40/32) = 2
        "nvfp4": (48 * 100 + 48 * 13 + 4, 48 * 20 + 48 * 3 + 4),  # ceil(200/16), ceil(40/16)
        "rowwise": (9600 + 4 * 48, 1920 + 4 * 48),  # one fp32 scale per row of x^T, w^T
    }
    memory = {r: recipe_memory_bytes(r, M, K, N) for r in COST_RECIPES}
    assert {r: (m.activation, m.weight_copy) for r, m in memory.items()} == expected
    for recipe, m in memory.items():
        assert m.recipe == recipe and m.total == sum(expected[recipe])
    with pytest.raises(dataclasses.FrozenInstanceError):
        memory["bf16"].activation = 0  # type: ignore[misc]


FP8 = ("delayed", "current", "block", "mxfp8", "rowwise")


def test_weight_copy_dominates_for_a_wide_layer() -> None:
    """tokens 16384, 8192 -> 32768: BF16 saves x (256 MiB); an FP8 recipe saves x^T (128 MiB)
    and w^T (256 MiB), more in all. NVFP4 (9/16 byte each) stays below: 216 MiB."""
    memory = {r: recipe_memory_bytes(r, 16384, 8192, 32768) for r in COST_RECIPES}
    assert memory["bf16"].total == 2 * 16384 * 8192 == 256 * 2**20
    for recipe in FP8:
        m = memory[recipe]
        assert m.total > memory["bf16"].total, recipe
        assert m.weight_copy > m.activation >= 16384 * 8192, recipe
    assert memory["delayed"].total == 384 * 2**20 + 8
    assert memory["nvfp4"].total == 216 * 2**20 + 8 < memory["bf16"].total


def test_activations_dominate_for_many_tokens() -> None:
    """tokens 262144, 4096 x 4096: the weight copy (16 MiB) is small next to x, so every
    recipe saves less than BF16's 2048 MiB (delayed 1040 MiB, about half)."""
    memory = {r: recipe_memory_bytes(r, 262144, 4096, 4096) for r in COST_RECIPES}
    for recipe in RECIPES:
        assert memory[recipe].total < memory["bf16"].total, recipe
    assert memory["delayed"].total == 1040 * 2**20 + 8


def test_payload_nvfp4_below_fp8() -> None:
    for tokens, width in ((M, K), (16384, 8192), (37, 129)):
        memory = {r: recipe_memory_bytes(r, tokens, width, width).total for r in RECIPES}
        assert memory["nvfp4"] < min(memory[r] for r in ("delayed", "block", "mxfp8"))
        x = {r: quantized_tensors(r, tokens, width, width)[0].rowwise.payload for r in RECIPES}
        assert x["nvfp4"] < x["delayed"] == x["mxfp8"] == x["block"] < 2 * tokens * width


def test_gemm_operand_bytes_memory_bound_by_hand() -> None:
    """At 1 byte/s and an enormous peak, gemm_s is the GEMMs' bytes. NVFP4 on sm_100:
    forward x_row 5404 + w_row 1084 + y 16000; dgrad dy_row 4604 + w_col 1108 + dx 19200;
    wgrad dy_col 4524 + x_col 5428 + dw 3840."""
    toy = DeviceSpec("toy", {"bf16": 1e30, "fp8": 1e30, "fp4": 1e30}, 1.0, "test")
    cost = recipe_layer_cost(toy, "nvfp4", M, K, N, compute_capability=BLACKWELL)
    assert cost.gemm_s == pytest.approx(22488 + 24912 + 13792)
    assert cost.cast_s == pytest.approx(HAND_CAST["nvfp4"][0])
    assert cost.total_s == pytest.approx(cost.gemm_s + cost.cast_s)
    bf16 = recipe_layer_cost(toy, "bf16", M, K, N, compute_capability=HOPPER)
    assert bf16.gemm_s == pytest.approx(3 * 2 * (9600 + 1920 + 8000))  # each GEMM 2(MK+KN+MN)
    assert (bf16.cast_bytes, bf16.cast_s) == (0, 0.0)


def test_compute_bound_at_datasheet_peaks() -> None:
    """tokens 16384, 8192 x 8192: 3 GEMMs of 2 M N K FLOPs at the FP8 (FP4) peak."""
    flops = 3 * 2 * 16384 * 8192 * 8192
    h100, b200 = SPECS["H100 SXM"], SPECS["B200"]
    delayed = recipe_layer_cost(h100, "delayed", 16384, 8192, 8192)
    assert delayed.gemm_s == pytest.approx(flops / 1979e12)
    assert delayed.cast_s == pytest.approx(4 * (16384 * 8192 * 2 + 8192**2) / 3.35e12, rel=1e-6)
    assert delayed.total_s == pytest.approx(delayed.gemm_s + delayed.cast_s)
    nvfp4 = recipe_layer_cost(b200, "nvfp4", 16384, 8192, 8192)
    assert nvfp4.math == "fp4" and nvfp4.gemm_s == pytest.approx(flops / 9e15)


def test_b200_fp4_is_twice_fp8() -> None:
    """HGX B200 datasheet: FP4 18 PF sparse per GPU, 9 PF dense, twice FP8's 4.5 PF."""
    assert SPECS["B200"].peak("fp4") == pytest.approx(2 * SPECS["B200"].peak("fp8"))
    for name in ("H100 SXM", "H200", "A100"):
        assert SPECS[name].peak("fp4") is None


@pytest.mark.parametrize("device", ["H100 SXM", "H200"])
@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4"])
def test_not_native_on_hopper(device: str, recipe: str) -> None:
    cost = recipe_layer_cost(SPECS[device], recipe, M, K, N)
    assert not cost.native
    assert cost.gemm_s is None and cost.cast_s is None and cost.total_s is None
    assert "not native" in cost.note and "sm_90" in cost.note
    assert cost.cast_bytes == HAND_CAST[recipe][0]  # the bytes are still counted


def test_native_where_expected() -> None:
    for recipe in COST_RECIPES:
        assert recipe_layer_cost(SPECS["B200"], recipe, M, K, N).native, recipe
    for recipe in ("bf16", "delayed", "current", "block", "rowwise"):
        cost = recipe_layer_cost(SPECS["H200"], recipe, M, K, N)
        assert cost.native and cost.total_s is not None, recipe
    for recipe in RECIPES:  # no FP8 tensor cores on an A100
        assert not recipe_layer_cost(SPECS["A100"], recipe, M, K, N).native


def test_missing_peak_gives_no_time() -> None:
    no_fp4 = DeviceSpec("toy", {"bf16": 1e15, "fp8": 2e15}, 1e12, "test")
    cost = recipe_layer_cost(no_fp4, "nvfp4", M, K, N, compute_capability=BLACKWELL)
    assert cost.native and cost.gemm_s is None and "fp4 peak" in cost.note


def test_errors() -> None:
    with pytest.raises(ValueError, match="Unknown recipe"):
        recipe_layer_cost(SPECS["H100 SXM"], "int8", M, K, N)
    with pytest.raises(ValueError, match="compute capability"):
        recipe_layer_cost(DeviceSpec("toy", {}, 1.0, "t"), "delayed", M, K, N)
    with pytest.raises(ValueError, match="tokens"):
        recipe_layer_cost(SPECS["H100 SXM"], "delayed", 0, K, N)


def test_table_has_every_recipe_on_every_device() -> None:
    rows = recipe_cost_table(tokens=M, width=K)
    assert {(r["device"], r["recipe"]) for r in rows} == {
        (d, r) for d in ("H100 SXM", "H200", "B200") for r in COST_RECIPES
    }
    assert len(rows) == 3 * len(COST_RECIPES)
    for row in rows:
        if row["recipe"] == "bf16":
            assert row["speedup"] == pytest.approx(1.0)
        assert (row["total_ms"] is None) == (row["speedup"] is None)
        memory = recipe_memory_bytes(row["recipe"], M, K, K)
        assert row["activation_MB"] == memory.activation / 1e6
        assert row["weight_copy_MB"] == memory.weight_copy / 1e6
        assert row["saved_MB"] == pytest.approx(row["activation_MB"] + row["weight_copy_MB"])
    na = {(r["device"], r["recipe"]) for r in rows if r["total_ms"] is None}
    assert na == {(d, r) for d in ("H100 SXM", "H200") for r in ("mxfp8", "nvfp4")}


def test_plot_returns_a_labelled_figure() -> None:
    rows = recipe_cost_table()
    fig = plot_recipe_costs(rows)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_title() and "ms" in ax.get_ylabel() and ax.get_xlabel() == "recipe"
    assert [t.get_text() for t in ax.get_xticklabels()] == list(COST_RECIPES)
    assert sum(t.get_text() == "n/a" for t in ax.texts) == 4
    with pytest.raises(ValueError):
        plot_recipe_costs([])
