"""The figures of the book's benchmarks, apart from them so that running a benchmark does not
import matplotlib: the ablation ladder's (``bench.ladder``'s rows: speed, MFU and memory per
rung, and the loss of every rung step by step) and the FP8 recipes' modelled cost
(``bench.recipe_cost``'s table).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..viz import label_hardware

__all__ = ["plot_ladder", "plot_ladder_losses", "plot_recipe_costs"]


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


def plot_recipe_costs(rows: Sequence[dict[str, Any]], title: str | None = None) -> Figure:
    """Grouped bars, one group per recipe and one bar per device: GEMM time (solid) under
    cast time (hatched), in ms; "n/a" where the device has no native kernel for the recipe.
    ``rows`` as ``recipe_cost_table`` returns them. The figure says it is a model."""
    if not rows:
        raise ValueError("plot_recipe_costs needs at least one row (recipe_cost_table).")
    devices = list(dict.fromkeys(r["device"] for r in rows))
    recipes = list(dict.fromkeys(r["recipe"] for r in rows))
    fig, ax = plt.subplots(figsize=(9.0, 4.0))
    bar = 0.8 / len(devices)
    for row in rows:
        i, j = devices.index(row["device"]), recipes.index(row["recipe"])
        x = j + (i - (len(devices) - 1) / 2) * bar
        if row["total_ms"] is None:
            ax.text(x, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=8, color="0.3")
            continue
        ax.bar(x, row["gemm_ms"], bar, color=f"C{i}")
        ax.bar(x, row["cast_ms"], bar, bottom=row["gemm_ms"], color=f"C{i}", alpha=0.4, hatch="//")
    first, top = rows[0], max((r["total_ms"] or 0.0) for r in rows)
    ax.set_ylim(0, 1.1 * top if top > 0 else 1.0)
    ax.set_xticks(range(len(recipes)), recipes)
    ax.set(
        title=title
        or (
            f"Linear layer training step per recipe (model), M={first['tokens']}, "
            f"K={first['in_features']}, N={first['out_features']}"
        ),
        xlabel="recipe",
        ylabel="modelled time per step (ms)",
    )
    handles = [Patch(color=f"C{i}", label=d) for i, d in enumerate(devices)]
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="//", label="quantize casts"))
    ax.legend(handles=handles, fontsize=8)
    label_hardware(
        ax,
        "roofline model from datasheet peaks and HBM bandwidth, not a measurement; "
        "n/a: no native kernel",
    )
    fig.tight_layout()
    return fig
