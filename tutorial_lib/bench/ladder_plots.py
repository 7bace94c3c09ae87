"""The ablation ladder's figures (``bench.ladder``'s rows): speed, MFU and memory per rung, and
the loss of every rung step by step. Apart from ``ladder``, so running the ladder does not import
matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ..viz import label_hardware

__all__ = ["plot_ladder", "plot_ladder_losses"]


def plot_ladder(
    rows: Sequence[dict[str, Any]], hardware: str | None = None, title: str | None = None
) -> Figure:
    """Bars of tokens/s, MFU and peak memory per rung (skipped rungs show their gap, labelled).

    Without a datasheet peak (a CPU) every MFU is ``n/a`` and the panel keeps a 0-100 % axis."""
    names = [r["rung"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2), sharey=True)
    panels = [
        ("tokens_per_s", "tokens / s", "tokens / s", 1.0),
        ("mfu", "MFU", "% of the datasheet peak", 100.0),
        ("peak_mem_bytes", "peak memory", "MiB", 1 / 2**20),
    ]
    y = list(range(len(rows)))
    for ax, (key, panel_title, unit, scale) in zip(axes, panels, strict=True):
        values = [None if "skipped" in r or r.get(key) is None else r[key] * scale for r in rows]
        ax.barh(y, [v or 0.0 for v in values], color=[f"C{i % 7}" for i in y])
        for i, v in zip(y, values, strict=True):
            text = "skipped" if "skipped" in rows[i] else ("n/a" if v is None else f"{v:,.3g}")
            ax.annotate(f" {text}", (v or 0.0, i), va="center", fontsize=8)
        ax.set(title=panel_title, xlabel=unit)
        if all(v is None for v in values):
            ax.set_xlim(0, 100 if key == "mfu" else 1)
        else:
            ax.set_xmargin(0.25)
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    if title:
        fig.suptitle(title)
    if hardware:
        label_hardware(axes[-1], hardware)
    fig.tight_layout()
    return fig


def plot_ladder_losses(rows: Sequence[dict[str, Any]], hardware: str | None = None) -> Figure:
    """Training loss per step for every rung that ran: the optimisations must not change it."""
    fig, ax = plt.subplots()
    for i, r in enumerate(rows):
        if "skipped" in r:
            continue
        losses = r["losses"]
        ax.plot(
            range(1, len(losses) + 1),
            losses,
            color=f"C{i % 7}",
            label=r["rung"],
            lw=1.4,
            ls="-" if i % 2 == 0 else "--",
        )
    ax.set_title("Loss parity across the ladder")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.legend(fontsize=8)
    if hardware:
        label_hardware(ax, hardware)
    return fig
