"""Exercise 3.1: round FP32 to BF16 with integer operations, checked against torch's cast and
``formats.round_to_format``."""

from __future__ import annotations

import torch

from ..formats import BF16, round_to_format
from .base import EXACT, Case, Exercise

STUB = '''\
import torch


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round a float32 tensor to bfloat16: to nearest, ties to even.

    x: float32 tensor of any shape (it may hold inf, NaN, subnormals).
    Returns a torch.bfloat16 tensor of the same shape, equal to
    x.to(torch.bfloat16), computed from the bits x.view(torch.int32)
    with integer operations (no float-to-bfloat16 cast).
    """
    raise NotImplementedError
'''

TASK = (
    "BF16 is the top 16 bits of an FP32 number. Round the 16 bits you drop to nearest, ties to "
    "even: add 0x7FFF plus the lowest kept bit to the 32-bit pattern, then keep its top 16 bits "
    "(an int16 tensor, `.view(torch.bfloat16)`). Numbers that round past the largest BF16 value "
    "must become inf, as they do in torch. NaN must stay NaN: handle it apart, since the top 16 "
    "bits of a NaN can spell inf, and the carry can spill into the sign bit."
)


def _from_bits(bits: torch.Tensor) -> torch.Tensor:
    """float32 tensor with the given bit patterns (int64 holding 32-bit unsigned values)."""
    signed = torch.where(bits >= 2**31, bits - 2**32, bits)
    return signed.to(torch.int32).view(torch.float32)


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(303)

    def bits(n: int, low: int | None = None) -> torch.Tensor:
        high = torch.randint(0, 2**16, (n,), generator=g, dtype=torch.int64)
        high = torch.where((high & 0x7F80) == 0x7F80, high ^ 0x0080, high)  # no inf/NaN
        rest = torch.randint(0, 2**16, (n,), generator=g) if low is None else torch.full((n,), low)
        return (high << 16) | rest

    normals = torch.randn(5, 123, generator=g) * torch.logspace(-4, 4, 5 * 123).reshape(5, 123)
    ties = _from_bits(bits(4 * 33, 0x8000)).reshape(4, 33)
    near_ties = _from_bits(torch.cat([bits(32, 0x8001), bits(32, 0x7FFF)]))
    patterns = _from_bits(bits(3 * 77)).reshape(3, 1, 77)
    special = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-40, -1e-45]
    near_max = [3.3895e38, 3.3896e38, 3.3961e38, 3.4028235e38, -3.39e38, 3.40e38]
    return [
        Case("random normals times 1e-4 .. 1e4, shape (5, 123)", {"x": normals}),
        Case("exact ties (the dropped bits are 0x8000), shape (4, 33)", {"x": ties}),
        Case("just above and just below a tie, shape (64,)", {"x": near_ties}),
        Case("random bit patterns, subnormals included, shape (3, 1, 77)", {"x": patterns}),
        Case("zeros, inf, NaN, tiny subnormals", {"x": torch.tensor(special)}),
        Case("near the largest BF16 value (some round to inf)", {"x": torch.tensor(near_max)}),
    ]


def _reference(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16)


def exact_reference(x: torch.Tensor) -> torch.Tensor:
    """The package's exact rounding, as bfloat16 (tests check it equals torch's cast here)."""
    return round_to_format(x, BF16).to(torch.bfloat16)


EXERCISES = [
    Exercise(
        id="3.1",
        title="round FP32 to BF16",
        function="round_to_bf16",
        signature="round_to_bf16(x: Tensor[float32]) -> Tensor[bfloat16]",
        task=TASK,
        stub=STUB,
        cases=_cases,
        reference=_reference,
        reference_name="x.to(torch.bfloat16) (and tutorial_lib.formats.round_to_format)",
        tolerance=EXACT,
    )
]
