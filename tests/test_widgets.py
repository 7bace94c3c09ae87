"""Tests for tutorial_lib.widgets: rounding rows, the explorer widget and the spacing plot."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from tutorial_lib.formats import FP16  # noqa: E402
from tutorial_lib.widgets import (  # noqa: E402
    plot_spacing,
    rounding_explorer,
    rounding_rows,
    rounding_table_html,
)


def test_rounding_rows_one_third() -> None:
    rows = rounding_rows(1 / 3)
    assert [r["format"] for r in rows] == ["FP32", "TF32", "BF16", "FP16"]
    assert set(rows[0]) == {"format", "rounded", "abs_error", "rel_error", "spacing"}
    by_name = {r["format"]: r for r in rows}
    assert by_name["FP32"]["rounded"] == float(torch.tensor(1 / 3, dtype=torch.float32))
    assert by_name["BF16"]["rounded"] == 0.333984375  # 171 / 512
    assert by_name["FP16"]["rounded"] == by_name["TF32"]["rounded"] == 0.333251953125  # 1365/4096
    assert by_name["BF16"]["spacing"] == 2.0**-9 and by_name["FP16"]["spacing"] == 2.0**-12
    for r in rows:
        assert r["abs_error"] == abs(r["rounded"] - 1 / 3)
        assert r["rel_error"] == pytest.approx(r["abs_error"] * 3)
        assert r["abs_error"] <= r["spacing"] / 2  # round to nearest


def test_rounding_rows_edge_values() -> None:
    big = {r["format"]: r for r in rounding_rows(1e5)}
    assert big["FP16"]["rounded"] == math.inf and big["FP16"]["spacing"] == math.inf
    assert big["BF16"]["rounded"] == 99840.0  # 1e5 on BF16's grid of 512
    for zero in rounding_rows(0.0):
        assert (zero["rounded"], zero["abs_error"], zero["rel_error"]) == (0.0, 0.0, 0.0)
    tiny = {r["format"]: r for r in rounding_rows(1e-8)}["FP16"]
    assert tiny["rounded"] == 0.0 and tiny["rel_error"] == 1.0  # underflow: all of it is lost


def test_explorer_renders_and_updates() -> None:
    pytest.importorskip("ipywidgets")
    box = rounding_explorer(0.1)
    text, slider, table = box.children
    assert type(text).__name__ == "FloatText" and type(table).__name__ == "HTML"
    assert type(slider).__name__ == "FloatLogSlider"
    assert table.value == rounding_table_html(0.1)  # filled before anyone touches it
    assert "0.1000976562" in table.value  # FP16's 0.1 (1638 / 16384)
    text.value = 65520.0
    assert table.value == rounding_table_html(65520.0) and "inf" in table.value
    assert slider.value == pytest.approx(65520.0)
    slider.value = 1e-3
    assert text.value == pytest.approx(1e-3) and table.value == rounding_table_html(text.value)
    text.value = -2.0
    slider.value = 4.0
    assert text.value == -4.0  # the slider sets the magnitude and keeps the sign


def test_explorer_default_is_one_third() -> None:
    pytest.importorskip("ipywidgets")
    assert rounding_explorer().children[0].value == pytest.approx(1 / 3)


def test_plot_spacing_one_step_curve_per_format() -> None:
    fig = plot_spacing()
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 4
    assert [t.get_text().split()[0] for t in ax.get_legend().get_texts()] == [
        "FP32",
        "TF32",
        "BF16",
        "FP16",
    ]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    fp16 = lines[3].get_xydata()
    # Spans the subnormals to max; relative gap 1 at the smallest subnormal, and in the normal
    # range between 2^-11 and 2^-10 (10 mantissa bits).
    assert fp16[0, 0] == pytest.approx(FP16.min_subnormal) and fp16[0, 1] == pytest.approx(1.0)
    assert fp16[-1, 0] == pytest.approx(FP16.max, rel=1e-3)
    normal = fp16[fp16[:, 0] >= FP16.min_normal]
    assert ((normal[:, 1] > 2.0**-11) & (normal[:, 1] <= 2.0**-10)).all()
    matplotlib.pyplot.close(fig)


def test_plot_spacing_on_given_axes() -> None:
    fig, ax = matplotlib.pyplot.subplots()
    assert plot_spacing(ax=ax) is fig and len(ax.get_lines()) == 4
    matplotlib.pyplot.close(fig)


def test_plot_fp8_histogram_reports_saturation() -> None:
    import torch

    from tutorial_lib.widgets import plot_fp8_histogram

    x = torch.linspace(-1000.0, 1000.0, 1001)
    fig = plot_fp8_histogram(x, "e4m3", 1.0)  # |x| > 448 saturates: 552 of 1001 values
    text = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "saturated 55.14%" in text
    assert fig.axes[0].get_xlabel() == "log2 |x * scale|"
    matplotlib.pyplot.close(fig)


def test_fp8_explorer_redraws_on_change() -> None:
    import torch

    from tutorial_lib.widgets import fp8_explorer

    tensors = {"a": torch.randn(500), "b": torch.randn(500) * 1e-4}
    box = fp8_explorer(tensors)
    (pick, fmt), shift, out = box.children[0].children, box.children[1], box.children[2]
    first = out.value
    assert first.startswith("<img src='data:image/png;base64,")
    shift.value = -20
    assert out.value != first
    fmt.value = "e5m2"
    pick.value = "b"
    assert out.value.startswith("<img")
