"""Exercise 4.1: an E4M3 quantizer in float32 arithmetic, checked against ``fp8.quantize``."""

from __future__ import annotations

import torch

from ..formats import finite_values
from ..fp8.formats import E4M3, quantize
from .base import EXACT, Case, Exercise

STUB = '''\
import torch


def quantize_e4m3(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The E4M3 value that stores x * scale, returned as float32.

    x: float32 tensor of any shape; scale: a Python float.
    Multiply in float32; saturate to +-448 (inf too); round to the
    nearest E4M3 value, ties to even; keep NaN. Don't use the
    torch.float8 dtypes: work out each binade's spacing yourself.
    Returns a float32 tensor of x's shape.
    """
    raise NotImplementedError
'''

TASK = (
    "E4M3 has 3 mantissa bits: between 2^e and 2^(e+1) its values are spaced 2^(e-3), for "
    "binades e = -6 .. 8; below 2^-6 the subnormals keep the spacing 2^-9, and the largest "
    "value is 448. Compute `y = x * scale` in float32, clamp it to [-448, 448] (so inf "
    "saturates as in Transformer Engine), find each value's binade (`torch.frexp` gives the "
    "exponent exactly), divide by the spacing, round half to even (`torch.round` does), and "
    "multiply back. NaN must stay NaN."
)


def _midpoints() -> torch.Tensor:
    """Every value exactly halfway between two neighbouring positive E4M3 values."""
    v = finite_values(E4M3)
    v = v[v >= 0]
    return ((v[1:] + v[:-1]) / 2).to(torch.float32)


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(404)
    normals = torch.randn(5, 123, generator=g)
    wide = torch.randn(7, 33, generator=g) * torch.logspace(-5, 3, 7 * 33).reshape(7, 33)
    mids = _midpoints()
    near_max = torch.tensor([440.0, 447.9, 448.0, 455.9, 456.0, 460.0, 464.0, 500.0, 1e30])
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -3e-3, 1e-4])
    tiny = torch.linspace(-(2.0**-5), 2.0**-5, 97)
    big = {"x": near_max / 8, "scale": 8.0}
    return [
        Case("standard normals, shape (5, 123), scale 1", {"x": normals, "scale": 1.0}),
        Case("values from 1e-5 to 1e3, shape (7, 33), scale 0.25", {"x": wide, "scale": 0.25}),
        Case("every tie between two E4M3 values, scale 1", {"x": mids, "scale": 1.0}),
        Case("every tie, negated, scale 2 applied to x / 2", {"x": -mids / 2, "scale": 2.0}),
        Case("around the largest value, 448 (x = 440 .. 1e30, / 8), scale 8", big),
        Case("zeros, inf, NaN, scale 1024", {"x": special, "scale": 1024.0}),
        Case("subnormals: |x| <= 2^-5, shape (97,), scale 1", {"x": tiny, "scale": 1.0}),
    ]


def _reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    return quantize(x, E4M3, scale).to(torch.float32)


EXERCISES = [
    Exercise(
        id="4.1",
        title="an E4M3 quantizer with scale and saturation",
        function="quantize_e4m3",
        signature="quantize_e4m3(x: Tensor[float32], scale: float) -> Tensor[float32]",
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=_reference,
        reference_name="tutorial_lib.fp8.quantize(x, E4M3, scale)",
        tolerance=EXACT,
    )
]
