"""Pictures of shard maps: which tensor-parallel rank owns which attention heads and FFN columns.

``plot_shard_maps`` draws one row per map and two strips per row, the heads and the FFN columns
(hidden units), each unit coloured by the rank that owns it. Uneven shards show as blocks of
different lengths, non-contiguous ones as interleaved colours. A rank keeps its colour across
rows, so a healthy map and its degraded version (``ntp.degraded_shard_map``) can be compared
unit by unit. The module imports matplotlib, so ``parallel/__init__`` does not import it.
"""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from .shard import ShardMap

__all__ = ["unit_owners", "rank_colors", "plot_shard_maps"]

AXIS_LABELS = {"heads": "attention head", "ffn": "FFN column (hidden unit)"}


def unit_owners(shard_map: ShardMap, axis: str) -> np.ndarray:
    """The owning TP rank of every unit of ``axis`` ("heads" or "ffn"), indexed by unit."""
    if axis not in AXIS_LABELS:
        raise ValueError(f"axis must be one of {tuple(AXIS_LABELS)}, got {axis!r}.")
    units = getattr(shard_map, axis)
    total = shard_map.n_head if axis == "heads" else shard_map.ffn_size
    owners = np.empty(total, dtype=int)
    for rank, mine in enumerate(units):
        owners[list(mine)] = rank
    return owners


def rank_colors(n: int) -> list[tuple[float, float, float, float]]:
    """One colour per rank, the same for rank r in every figure (tab10, then tab20)."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    if n > cmap.N:
        raise ValueError(f"Cannot colour {n} ranks distinctly (at most {cmap.N}).")
    return [cmap(i) for i in range(n)]


def plot_shard_maps(
    maps: Mapping[str, ShardMap],
    title: str = "Which TP rank owns which units",
    note: str | None = None,
) -> Figure:
    """One row per named map: heads (left) and FFN columns (right), coloured by owning rank.

    ``note`` goes under the figure (e.g. what the maps are for); with at most 32 heads, each
    head's cell shows the number of its rank.
    """
    if not maps:
        raise ValueError("Give at least one shard map to draw.")
    n_ranks = max(m.tp for m in maps.values())
    colors = rank_colors(n_ranks)
    cmap = ListedColormap(colors)
    rows = len(maps)
    fig, axes = plt.subplots(
        rows,
        2,
        figsize=(10.0, 0.75 * rows + 1.5),
        squeeze=False,
        gridspec_kw={"width_ratios": [1, 3]},
    )
    for row, (name, shard_map) in enumerate(maps.items()):
        for col, axis in enumerate(AXIS_LABELS):
            ax = axes[row][col]
            owners = unit_owners(shard_map, axis)
            ax.imshow(
                owners[None, :],
                aspect="auto",
                cmap=cmap,
                vmin=-0.5,
                vmax=n_ranks - 0.5,
                interpolation="nearest",
                extent=(-0.5, len(owners) - 0.5, 0, 1),
            )
            ax.set_yticks([])
            ax.grid(False)
            if axis == "heads" and len(owners) <= 8:
                ax.set_xticks(range(len(owners)))
            else:
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if axis == "heads" and len(owners) <= 32:
                for unit, rank in enumerate(owners):
                    ax.text(
                        unit,
                        0.5,
                        str(rank),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white",
                        fontweight="bold",
                    )
            if col == 0:
                ax.set_ylabel(name, rotation=0, ha="right", va="center", fontsize=9)
            if row == 0:
                ax.set_title("Attention heads" if axis == "heads" else "FFN columns", fontsize=10)
            if row == rows - 1:
                ax.set_xlabel(f"{AXIS_LABELS[axis]} index")
    handles = [Patch(color=colors[r], label=f"TP rank {r}") for r in range(n_ranks)]
    fig.legend(
        handles=handles,
        loc="upper center",
        ncol=min(n_ranks, 8),
        fontsize=8,
        bbox_to_anchor=(0.5, 0.0),
    )
    fig.suptitle(title, fontsize=12, fontweight="bold")
    if note:
        fig.text(
            0.99, -0.08 - 0.03 * (n_ranks > 8), note, ha="right", va="top", fontsize=8, color="0.4"
        )
    fig.tight_layout()
    return fig
