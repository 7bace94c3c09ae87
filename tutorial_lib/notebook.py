"""What every chapter notebook does first: the book's plot style, the preset, the device, and a
label for the numbers the chapter will show.

One call replaces the setup lines each notebook used to repeat::

    preset, device, hw, HW_LABEL = tl.setup_chapter("measured")

``HW_LABEL`` goes on every figure and table of measured numbers, so a reader can always tell on
which machine, on which day and at which preset a number was taken.
"""

from __future__ import annotations

from datetime import date
from typing import Any, NamedTuple

import torch

from . import viz
from .config import RunPreset, get_preset
from .hardware import DeviceInfo, default_device, describe_device

# What the chapter does with the device: the first word of its label.
KINDS = {
    "measured": "measured on {hw}",
    "computed": "computed on {hw}",
    "run": "run on {hw}",
    "simulated": "simulation (a model, not a measurement)",
}


class ChapterSetup(NamedTuple):
    """The four names every chapter uses (unpack them in the first cell)."""

    preset: RunPreset
    device: torch.device
    hw: DeviceInfo
    label: str


def setup_chapter(kind: str = "measured", device: torch.device | str | None = None) -> ChapterSetup:
    """Apply the book's plot style, pick the preset and device, and print what was found.

    ``kind`` says what the chapter's numbers are (one of ``KINDS``): ``"measured"`` timings,
    ``"computed"`` values, ``"run"`` for processes started on this machine, or ``"simulated"``
    for a model with no measurement in it. ``device`` defaults to the first CUDA GPU, else the
    CPU. The preset comes from ``TUTORIAL_PRESET`` (``hopper`` is chosen on an sm_90 GPU).
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not one of {sorted(KINDS)}: say what the numbers are")
    viz.use_book_style()
    preset = get_preset()
    dev = default_device(device)
    hw = describe_device(dev)
    what = KINDS[kind].format(hw=hw.name)
    label = f"{what}, {date.today().isoformat()}, preset {preset.name}"
    print(f"hardware: {hw.summary()} | preset: {preset.name} (model {preset.model})")
    return ChapterSetup(preset, dev, hw, label)


def glue(name: str, value: Any) -> None:
    """Give the prose a number this cell computed: myst-nb's ``glue`` (the prose reads it with
    ``{glue:text}`` where the book is built). Where myst-nb is not installed (a notebook opened
    without the book's tools), the cell's printed output is where the number shows."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    myst_glue(name, value, display=False)
