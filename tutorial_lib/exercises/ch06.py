"""Exercise 6.1: Float8BlockScaling's 1x128 activation tiles, checked bit for bit against
``fp8.get_quantizer("block", "input")`` (TE's rules: power-of-two scales, E4M3)."""

from __future__ import annotations

import torch

from ..fp8.quantizers import get_quantizer
from .base import EXACT, Case, Exercise

STUB = '''\
import torch


def block_quantize_1x128(
    x: torch.Tensor, fp8_max: float = 448.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float8BlockScaling's 1x128 tiles (activations), as in TE.

    x: any shape, float32 or bfloat16, finite. Read it as a matrix
    (rows, cols) = (prod(x.shape[:-1]), x.shape[-1]) and cut every
    row into tiles of 128 elements (the last one may be shorter).
    Per tile, in float32:
      amax = max |x| over the tile;
      scale = fp8_max / amax, rounded DOWN to a power of two: clear
        the 23 mantissa bits of its float32 bits (or use torch.frexp;
        torch.log2 can round up just below a power of two);
      a tile of zeros (amax 0) gets scale 1.
    Returns (data, scale_inv):
      data: x * scale in float32, clamped to +-fp8_max, cast to
        torch.float8_e4m3fn; x's shape;
      scale_inv: 1 / scale, float32, shape (rows, ceil(cols / 128)).
    """
    raise NotImplementedError
'''

TASK = (
    "Float8BlockScaling gives every 128 consecutive elements of a row of an activation their "
    "own scale. Read `x` as a matrix whose rows are all its leading dimensions, cut each row "
    "into tiles of 128 elements (the last tile may be shorter), and for each tile take "
    "`amax = max|x|`, `scale = fp8_max / amax` in float32 rounded down to a power of two (a "
    "tile of zeros keeps scale 1), and store `x * scale` as E4M3. Return that FP8 tensor, in "
    "`x`'s shape, and the float32 grid of `1 / scale`, one per tile."
)

BLOCK = 128


def _spread(g: torch.Generator, *shape: int) -> torch.Tensor:
    """Signed values whose magnitudes span about six decades, as activations with outliers."""
    mag = torch.rand(*shape, generator=g) * 10.0 ** torch.randint(-4, 2, shape, generator=g)
    sign = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)
    return sign * mag


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(606)
    zeros = _spread(g, 4, 257)
    zeros[1, BLOCK : 2 * BLOCK] = 0.0  # a whole tile of zeros: scale 1
    zeros[2, :BLOCK] *= 1e-30  # a tiny tile: a huge (but finite) scale
    edge = _spread(g, 2, 256).clamp(-3.5, 3.5)
    edge[0, 5] = torch.nextafter(torch.tensor(3.5), torch.tensor(4.0))  # 448 / amax < 128: 64
    edge[1, BLOCK + 7] = 3.5  # 448 / 3.5 = 128 exactly: the scale is 128
    xs = [
        ("(1, 128): one full tile", _spread(g, 1, 128)),
        ("(3, 200): a last tile of 72 elements", _spread(g, 3, 200)),
        ("(2, 5, 130) bfloat16: leading dims flattened", _spread(g, 2, 5, 130).bfloat16()),
        ("(4, 257): a tile of zeros and a tiny tile", zeros),
        ("(2, 256): tile amaxes 3.5 and just above it (448 / amax near 128)", edge),
        ("(64, 384) bfloat16, many tiles", _spread(g, 64, 384).bfloat16()),
    ]
    return [Case(label, {"x": x}) for label, x in xs]


def _reference(x: torch.Tensor, fp8_max: float = 448.0) -> tuple[torch.Tensor, torch.Tensor]:
    q = get_quantizer("block", "input").quantize(x)  # E4M3, 1x128 tiles, power-of-two scales
    return q.data, q.scale_inv


EXERCISES = [
    Exercise(
        id="6.1",
        title="a 1x128 block quantizer (Float8BlockScaling's activation tiles)",
        function="block_quantize_1x128",
        signature=(
            "block_quantize_1x128(x: Tensor (..., cols), fp8_max: float = 448.0) "
            "-> tuple[Tensor, Tensor (rows, ceil(cols/128))]"
        ),
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=_reference,
        reference_name='tutorial_lib.fp8.get_quantizer("block", "input")',
        outputs=("data", "scale_inv"),
        tolerance=EXACT,
    )
]
