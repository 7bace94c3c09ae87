"""Chapter 10's figure of the TP ridge with a ring all-reduce and with NVLink SHARP (NVLS).

Matplotlib lives here, not in ``tp_traffic`` (the cost model stays numpy-only), as it does in
``explore``.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..hardware import DeviceSpec
from ..viz import label_hardware
from . import tp_traffic
from .tp_traffic import Link

__all__ = ["ALGORITHM_STYLES", "plot_allreduce_ridge"]

# One line style per all-reduce algorithm, in every panel.
ALGORITHM_STYLES = {"ring": ("-", "ring all-reduce"), "nvls": ("--", "NVLS (in-switch sum)")}


def plot_allreduce_ridge(
    spec: DeviceSpec,
    link: Link,
    hiddens: Sequence[int] = (1024, 4096, 8192, 16384),
    degrees: Sequence[int] = tuple(range(2, 33)),
    dtype: str = "bf16",
    dtype_bytes: int = 2,
    hardware: str | None = None,
) -> Figure:
    """Two panels over the TP degree, each with one curve per all-reduce algorithm.

    Left: the network intensity of a layer of each width in ``hiddens`` (solid: ring, dashed:
    NVLS) against ``link``'s ridge for ``spec``. Right: the width a layer needs to reach the
    ridge at each degree (``tp_traffic.ridge_width``), below which the link is the bottleneck.
    """
    ridge = tp_traffic.link_ridge(spec, link, dtype)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, hidden in enumerate(hiddens):
        for algorithm, (style, _) in ALGORITHM_STYLES.items():
            y = [
                tp_traffic.tp_network_intensity(hidden, t, dtype_bytes, algorithm) for t in degrees
            ]
            label = f"h = {hidden}" if algorithm == "ring" else None
            left.plot(degrees, y, style, color=f"C{i % 10}", label=label)
    left.axhline(ridge, color="0.2", ls=":", lw=1.2, label=f"ridge, {ridge:,.0f} FLOP/byte")
    for algorithm, (style, name) in ALGORITHM_STYLES.items():
        needed = [
            tp_traffic.ridge_width(spec, link, t, dtype, dtype_bytes, algorithm) for t in degrees
        ]
        right.plot(degrees, needed, style, color="0.2", label=name)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ticks = [t for t in (2, 4, 8, 16, 32, 64) if min(degrees) <= t <= max(degrees)]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("TP degree t")
    left.set(
        yscale="log",
        title=f"Network intensity of a TP layer over {link.name.split(' (')[0]}",
        ylabel=f"GEMM FLOPs per byte sent ({dtype.upper()})",
    )
    right.set(
        yscale="log",
        title="Width a layer needs to reach the ridge",
        ylabel="hidden size h (elements)",
    )
    styles = [Line2D([], [], ls=s, color="0.2", label=n) for s, n in ALGORITHM_STYLES.values()]
    handles, _ = left.get_legend_handles_labels()
    left.legend(handles=handles + styles, fontsize=7, loc="lower left")
    right.legend(fontsize=8, loc="upper left")
    if hardware:
        label_hardware(right, hardware)
    fig.tight_layout()
    return fig
