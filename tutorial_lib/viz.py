"""One plotting style for the whole book, and the figures several chapters share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import matplotlib as mpl
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure, SubFigure
from matplotlib.rcsetup import cycler

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

__all__ = ["BOOK_STYLE", "use_book_style", "loss_curve", "label_hardware"]

BOOK_STYLE: dict[RcKeyType, object] = {
    "figure.figsize": (7.0, 4.0),
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "legend.frameon": False,
    "lines.linewidth": 1.8,
    "axes.prop_cycle": cycler(
        color=["#76b900", "#1f77b4", "#d62728", "#9467bd", "#ff7f0e", "#17becf", "#7f7f7f"]
    ),
}


def use_book_style() -> None:
    """Apply the book's matplotlib style globally (every chapter's first cell calls this)."""
    mpl.rcParams.update(BOOK_STYLE)


def label_hardware(ax: Axes, text: str) -> None:
    """Stamp the hardware (and date) a figure was measured on in its lower-right corner."""
    ax.annotate(
        text,
        xy=(1.0, -0.18),
        xycoords="axes fraction",
        ha="right",
        va="top",
        fontsize=8,
        color="0.4",
    )


def loss_curve(
    runs: Mapping[str, Sequence[Mapping[str, float | None]]],
    title: str = "Training loss",
    hardware: str | None = None,
    ax: Axes | None = None,
) -> Figure | SubFigure:
    """Plot train loss (lines) and validation loss (markers) per step for one or more runs.

    ``runs`` maps a label to a Trainer history (a list of per-step metric dicts).
    Returns the figure ``ax`` is in (a ``SubFigure`` if ``ax`` belongs to one).
    """
    if ax is None:
        _, ax = plt.subplots()
    for i, (label, history) in enumerate(runs.items()):
        color = f"C{i}"
        steps = [int(r["step"]) + 1 for r in history]  # type: ignore[arg-type]
        loss = [float(r["loss"]) for r in history]  # type: ignore[arg-type]
        ax.plot(steps, loss, color=color, label=f"{label} (train)")
        val = [
            (s, r["val_loss"])
            for s, r in zip(steps, history, strict=True)
            if r.get("val_loss") is not None
        ]
        if val:
            ax.plot(*zip(*val, strict=True), "o--", color=color, ms=5, lw=1, label=f"{label} (val)")
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.legend()
    if hardware:
        label_hardware(ax, hardware)
    return ax.figure
