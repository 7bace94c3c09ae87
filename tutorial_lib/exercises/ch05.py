"""Exercise 5.1: one delayed-scaling update (amax history roll and new scale), checked against
``fp8.scaling.update_amax_and_scale`` (Transformer Engine's kernel, "max" algorithm)."""

from __future__ import annotations

from typing import Any

import torch

from ..fp8.formats import E4M3, E5M2
from ..fp8.scaling import update_amax_and_scale
from .base import Case, Exercise

STUB = '''\
import torch


def delayed_scaling_update(
    amax_history: torch.Tensor,
    scale: torch.Tensor,
    fp8_max: float,
    margin: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One delayed-scaling update, "max" algorithm, as in TE.

    amax_history: (L, n) float32; row 0 holds this step's amax.
    scale: (n,) float32, the current scales.
    Returns (new_history, new_scale): new tensors, inputs untouched.
    In each column whose current amax (row 0) is not 0:
      amax = the largest of rows 1 .. L-1 and the current amax;
      the history rolls: row i <- row i + 1, the last row <- the
      current amax, then row 0 <- 0 (ready for the next step);
      scale = fp8_max * 2**-margin / amax (float32).
    A column whose current amax is 0 keeps its history and scale.
    """
    raise NotImplementedError
'''

TASK = (
    "Each FP8 tensor keeps a column of the last L amaxes; row 0 collects the current step's. "
    "After the step, for each column whose current amax is non-zero, take amax as the maximum "
    "of the window (rows 1 .. L-1 of the old history plus the current amax), roll the history "
    "up by one row with the current amax as the newest row and a cleared row 0, and set "
    "`scale = fp8_max * 2**-margin / amax` in float32. Columns that saw no amax (row 0 is 0) "
    "keep their history and scale. Return new tensors; leave the inputs unchanged."
)


def _history(
    g: torch.Generator, length: int, n: int, zero_cols: tuple[int, ...] = ()
) -> torch.Tensor:
    """Positive amaxes spread over decades, as a real history; ``zero_cols`` saw no amax."""
    h = torch.rand(length, n, generator=g) * 10.0 ** torch.randint(-3, 3, (length, n), generator=g)
    h[0, list(zero_cols)] = 0.0
    return h


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(505)
    out = []
    # (L, n, fp8_max, margin, columns with no current amax)
    for length, n, fmt, margin, zeros in [
        (4, 3, E4M3, 0, ()),
        (16, 5, E4M3, 1, (1, 4)),
        (1, 4, E5M2, 0, (2,)),
        (7, 2, E5M2, 3, ()),
        (1024, 3, E4M3, 0, (0,)),
    ]:
        args: dict[str, Any] = {
            "amax_history": _history(g, length, n, zeros),
            "scale": torch.rand(n, generator=g) + 0.5,
            "fp8_max": fmt.max,
            "margin": margin,
        }
        skipped = f", columns {list(zeros)} saw no amax" if zeros else ""
        label = f"history ({length}, {n}), {fmt.name} max {fmt.max:g}, margin {margin}{skipped}"
        out.append(Case(label, args))
    return out


def _reference(
    amax_history: torch.Tensor, scale: torch.Tensor, fp8_max: float, margin: int
) -> tuple[torch.Tensor, torch.Tensor]:
    return update_amax_and_scale(amax_history, scale, fp8_max, margin, "max")


EXERCISES = [
    Exercise(
        id="5.1",
        title="the amax-history roll and scale update of delayed scaling",
        function="delayed_scaling_update",
        signature=(
            "delayed_scaling_update(amax_history: Tensor (L, n), scale: Tensor (n,), "
            "fp8_max: float, margin: int) -> tuple[Tensor, Tensor]"
        ),
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=_reference,
        reference_name='tutorial_lib.fp8.update_amax_and_scale(..., "max")',
        outputs=("new_history", "new_scale"),
    )
]
