"""Interactive and static views of number formats for chapter 3: tables, an explorer, a plot.

``rounding_explorer`` needs ``ipywidgets`` (the ``book`` extra) and imports it only when called;
everything else needs only torch and matplotlib.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .formats import FORMATS, FloatFormat, round_to_format

__all__ = [
    "rounding_rows",
    "rounding_table_html",
    "rounding_explorer",
    "plot_spacing",
    "plot_fp8_histogram",
    "fp8_explorer",
]


def rounding_rows(value: float) -> list[dict[str, Any]]:
    """What each format of ``formats.FORMATS`` (FP32, TF32, BF16, FP16) stores for ``value``:
    one row per format.

    Keys: ``format`` (display name, e.g. "BF16"), ``rounded`` (the stored value, a float),
    ``abs_error`` = |rounded - value|, ``rel_error`` = abs_error / |value| (0 for value 0; inf or
    NaN once the value overflows), ``spacing`` (gap between neighbours at |value|, see
    ``FloatFormat.spacing``). ``value`` is a Python float (float64), so even FP32 shows an error.
    """
    value = float(value)
    rows = []
    for fmt in FORMATS.values():
        rounded = float(round_to_format(value, fmt))
        abs_error = abs(rounded - value)
        rel_error = abs_error / abs(value) if value != 0 else (0.0 if rounded == 0 else math.inf)
        rows.append(
            {
                "format": fmt.name,
                "rounded": rounded,
                "abs_error": abs_error,
                "rel_error": rel_error,
                "spacing": fmt.spacing(value),
            }
        )
    return rows


def rounding_table_html(value: float) -> str:
    """``rounding_rows`` as an HTML table (the explorer's output; also fine for a static page)."""
    header = "".join(
        f"<th style='text-align:right;padding:2px 8px'>{h}</th>"
        for h in ("format", "stored value", "abs. error", "rel. error", "spacing")
    )
    body = []
    for r in rounding_rows(value):
        cells = [
            r["format"],
            f"{r['rounded']:.10g}",
            f"{r['abs_error']:.3e}",
            f"{r['rel_error']:.3e}",
            f"{r['spacing']:.3e}",
        ]
        tds = "".join(
            f"<td style='text-align:right;padding:2px 8px;font-family:monospace'>"
            f"{html.escape(c)}</td>"
            for c in cells
        )
        body.append(f"<tr>{tds}</tr>")
    caption = f"<caption>x = {html.escape(repr(float(value)))} (float64)</caption>"
    return f"<table>{caption}<thead><tr>{header}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _import_ipywidgets() -> Any:
    try:
        import ipywidgets
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "rounding_explorer needs ipywidgets: pip install 'tutorial_lib[book]' "
            "(or pip install ipywidgets). rounding_rows gives the same numbers without it."
        ) from err
    return ipywidgets


def rounding_explorer(value: float = 1 / 3) -> Any:
    """A ``VBox``: type a number (or drag its magnitude on a log slider), see how each format
    stores it. Children: ``[FloatText, FloatLogSlider, HTML]``.

    The table is filled in before the widget is returned, so a page built from saved widget
    state (no kernel) still shows the table for the initial ``value``.
    """
    widgets = _import_ipywidgets()
    text = widgets.FloatText(value=value, description="x =")
    slider = widgets.FloatLogSlider(
        value=_slider_magnitude(value),
        base=10,
        min=-45,
        max=38.5,
        step=0.01,
        description="|x|",
        readout_format=".3e",
        continuous_update=False,
    )
    table = widgets.HTML(value=rounding_table_html(value))
    busy = [False]  # guards against the text <-> slider echo

    def on_text(change: dict[str, Any]) -> None:
        table.value = rounding_table_html(change["new"])
        if not busy[0]:
            busy[0] = True
            slider.value = _slider_magnitude(change["new"])
            busy[0] = False

    def on_slider(change: dict[str, Any]) -> None:
        if not busy[0]:
            busy[0] = True
            text.value = math.copysign(change["new"], text.value or 1.0)
            busy[0] = False

    text.observe(on_text, names="value")
    slider.observe(on_slider, names="value")
    return widgets.VBox([text, slider, table])


def _slider_magnitude(value: float) -> float:
    """|value| clamped into the slider's range (zero, inf and NaN show at an end)."""
    a = abs(float(value))
    if math.isnan(a) or a == 0:
        return 1e-45
    return min(max(a, 1e-45), 10**38.5)


def plot_spacing(ax: Axes | None = None) -> Figure:
    """*Relative* gap between neighbouring representable numbers vs magnitude, log-log, one step
    curve per format of ``formats.FORMATS`` from its smallest subnormal to its max.

    In the normal range the gap doubles every binade, so the relative gap (gap / |x|) stays
    between 2^-man_bits and 2^-(man_bits+1): a flat band whose height is the precision and whose
    width is the range. In the subnormal range the gap is constant, so the relative gap rises
    towards 1 at the smallest subnormal. Call ``viz.use_book_style()`` first for the book's look.
    """
    if ax is None:
        _, ax = plt.subplots()
    for fmt in FORMATS.values():
        lo, hi = math.log10(fmt.min_subnormal), math.log10(fmt.max)
        xs = [10 ** (lo + (hi - lo) * i / 1999) for i in range(2000)]
        xs[-1] = fmt.max * (1 - 2.0 ** -(fmt.man_bits + 2))  # just below max: finite gap
        rel = [fmt.spacing(x) / x for x in xs]
        label = f"{fmt.name} ({fmt.exp_bits}e{fmt.man_bits}m, max {fmt.max:.3g})"
        ax.plot(xs, rel, label=label, lw=1.2)
    ax.set_xscale("log", base=10)
    ax.set_yscale("log", base=10)
    ax.set_title("Relative gap between representable numbers")
    ax.set_xlabel("magnitude |x| (log scale)")
    ax.set_ylabel("gap to the next number / |x|")
    ax.legend(fontsize=8)
    return ax.figure  # type: ignore[return-value]


def plot_fp8_histogram(
    x: torch.Tensor, fmt: str | FloatFormat, scale: float, ax: Axes | None = None, title: str = ""
) -> Figure:
    """Histogram of log2|x * scale| (non-zero values) against the FP8 format's window.

    Shaded: above ``max`` the values saturate; below the smallest subnormal they flush to zero;
    between the smallest subnormal and ``min_normal`` they lose precision. The text box gives
    ``fp8.stats.quant_stats`` for this scale.
    """
    from .fp8.formats import get_fp8_format
    from .fp8.stats import quant_stats

    fp8 = get_fp8_format(fmt)
    if ax is None:
        _, ax = plt.subplots()
    v = (x.detach().float().flatten() * scale).abs()
    logs = torch.log2(v[v > 0]).clamp(-60, 60).numpy()
    lo, hi = math.log2(fp8.min_subnormal), math.log2(fp8.max)
    ax.hist(logs, bins=120, color="C1", alpha=0.85)
    ax.axvspan(hi, max(hi + 1, logs.max() + 1 if logs.size else hi + 1), color="C2", alpha=0.15)
    ax.axvspan(min(lo - 1, logs.min() - 1 if logs.size else lo - 1), lo, color="C3", alpha=0.15)
    ax.axvspan(lo, math.log2(fp8.min_normal), color="0.5", alpha=0.12)
    for xv, label in ((hi, "max"), (math.log2(fp8.min_normal), "min normal"), (lo, "min sub.")):
        ax.axvline(xv, color="0.3", lw=1, ls="--")
        ax.annotate(
            label,
            (xv, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            rotation=90,
            va="top",
            ha="right",
        )
    st = quant_stats(x, fp8, scale)
    ax.text(
        0.30,
        0.97,
        f"saturated {st.saturated:.2%}\nflushed {st.flushed:.2%}\nrel. RMS error {st.rel_rmse:.3f}",
        transform=ax.transAxes,
        va="top",
        fontsize=8,
        bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"},
    )
    ax.set(
        title=title or f"{fp8.name} at scale 2^{math.log2(scale):.1f}",
        xlabel="log2 |x * scale|",
        ylabel="count",
    )
    return ax.figure  # type: ignore[return-value]


def _figure_html(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return f"<img src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'/>"


def fp8_explorer(tensors: Mapping[str, torch.Tensor], fmt: str = "e4m3", shift: int = 0) -> Any:
    """Pick a tensor, a format and a scale (as a power-of-two shift from the scale that maps the
    tensor's amax onto the format's max) and see its histogram against the format's window.

    The figure is an embedded PNG inside an HTML widget, drawn before this returns, so the saved
    widget state shows it on a static page; ``plot_fp8_histogram`` is the plain-function form.
    """
    from .fp8.stats import scale_for

    w = _import_ipywidgets()
    names = list(tensors)
    pick = w.Dropdown(options=names, value=names[0], description="tensor")
    fmt_w = w.ToggleButtons(options=["e4m3", "e5m2"], value=fmt, description="format")
    shift_w = w.IntSlider(value=shift, min=-24, max=12, description="log2 shift")
    out = w.HTML()

    def redraw(_change: object = None) -> None:
        x = tensors[pick.value]
        scale = scale_for(x.abs().max().item(), fmt_w.value) * 2.0**shift_w.value
        out.value = _figure_html(plot_fp8_histogram(x, fmt_w.value, scale, title=pick.value))

    for widget in (pick, fmt_w, shift_w):
        widget.observe(redraw, names="value")
    redraw()
    return w.VBox([w.HBox([pick, fmt_w]), shift_w, out])
