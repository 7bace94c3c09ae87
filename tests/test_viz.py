"""Tests for tutorial_lib.viz: the book's plotting style and the shared loss-curve figure."""

from __future__ import annotations

from collections.abc import Iterator

import matplotlib

matplotlib.use("Agg")

import matplotlib as mpl  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from tutorial_lib.viz import BOOK_STYLE, loss_curve, use_book_style  # noqa: E402


@pytest.fixture(autouse=True)
def isolated_style() -> Iterator[None]:
    """Each test gets (and leaves behind) matplotlib's global state as it found it."""
    with mpl.rc_context():
        yield
    plt.close("all")


def _history(losses: list[float], val: dict[int, float] | None = None) -> list[dict]:
    val = val or {}
    return [{"step": i, "loss": x, "val_loss": val.get(i)} for i, x in enumerate(losses)]


def test_use_book_style_sets_rcparams() -> None:
    mpl.rcParams["axes.grid"] = False
    use_book_style()
    assert mpl.rcParams["axes.grid"] is True
    assert list(mpl.rcParams["figure.figsize"]) == [7.0, 4.0]
    assert mpl.rcParams["axes.spines.top"] is False
    assert mpl.rcParams["axes.prop_cycle"].by_key()["color"][0] == "#76b900"
    for key in BOOK_STYLE:
        assert key in mpl.rcParams, key


def test_loss_curve_labels_and_lines() -> None:
    runs = {
        "fp32": _history([5.5, 4.0, 3.2, 2.9, 2.7], val={1: 4.1, 4: 2.8}),
        "bf16": _history([5.5, 4.1, 3.3, 3.0, 2.8]),
    }
    fig = loss_curve(runs, title="Loss, CPU")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert ax.get_title() == "Loss, CPU"
    assert ax.get_xlabel() and ax.get_ylabel()
    assert "nats" in ax.get_ylabel()  # the unit is on the axis
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"fp32 (train)", "fp32 (val)", "bf16 (train)"}
    # Steps are plotted 1-based (after step i, i + 1 steps have been taken).
    np.testing.assert_array_equal(lines["fp32 (train)"].get_xdata(), [1, 2, 3, 4, 5])
    np.testing.assert_allclose(lines["bf16 (train)"].get_ydata(), [5.5, 4.1, 3.3, 3.0, 2.8])
    np.testing.assert_array_equal(lines["fp32 (val)"].get_xdata(), [2, 5])
    np.testing.assert_allclose(lines["fp32 (val)"].get_ydata(), [4.1, 2.8])
    assert lines["fp32 (val)"].get_marker() == "o"
    # One colour per run, shared by its train line and its val markers.
    assert lines["fp32 (train)"].get_color() == lines["fp32 (val)"].get_color()
    assert lines["fp32 (train)"].get_color() != lines["bf16 (train)"].get_color()
    assert ax.get_legend() is not None


def test_loss_curve_on_given_axes_with_hardware_label() -> None:
    fig, (left, right) = plt.subplots(1, 2)
    out = loss_curve({"run": _history([3.0, 2.0])}, ax=right, hardware="2-core CPU, ci preset")
    assert out is fig
    assert not left.get_lines() and len(right.get_lines()) == 1
    assert any(t.get_text() == "2-core CPU, ci preset" for t in right.texts)
