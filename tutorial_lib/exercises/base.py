"""What an exercise is: the text a reader sees, the cases it is checked on, and the reference.

An ``Exercise`` holds everything a notebook shows about it (title, signature, task, stub source)
next to everything the checker needs (seeded cases, the package function it is compared with,
the tolerance), so the notebook's text and the check cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Case", "Exercise", "Tolerance", "DTYPE_TOLERANCE", "NUMBER_TOLERANCE", "EXACT"]


@dataclass(frozen=True)
class Tolerance:
    """Values match when ``|got - expected| <= atol + rtol * |expected|`` (NaN matches NaN)."""

    atol: float
    rtol: float

    def __str__(self) -> str:
        if self.atol == 0 and self.rtol == 0:
            return "exact match needed"
        return f"allowed: |got - expected| <= {self.atol:g} + {self.rtol:g} * |expected|"


EXACT = Tolerance(0.0, 0.0)

# Per dtype, as Liger Kernel's tests: fp32 about 1e-5, bf16 about 2e-2. Integer, bool and FP8
# tensors must match exactly.
DTYPE_TOLERANCE: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(1e-8, 1e-7),
    torch.float32: Tolerance(1e-5, 1e-5),
    torch.float16: Tolerance(1e-3, 1e-3),
    torch.bfloat16: Tolerance(2e-2, 2e-2),
}
NUMBER_TOLERANCE = Tolerance(1e-12, 1e-6)  # Python floats (a formula evaluated in float64)


@dataclass(frozen=True)
class Case:
    """One call of the reader's function: ``fn(*args.values())``; ``label`` says what is odd
    about it (shown when the case fails)."""

    label: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Exercise:
    """One exercise in which the reader writes a function.

    Shown to the reader:
        id: "4.1": chapter 4, exercise 1.
        title: a few words.
        function: the name of the function the reader writes (the stub defines it).
        signature: its signature with types, e.g. ``quantize_e4m3(x: Tensor, scale: float)``.
        task: one paragraph: what the function must compute.
        stub: the source of a notebook cell: imports, and the function with a docstring whose
            body is ``raise NotImplementedError``.
    Checked:
        cases: builds the seeded cases (called by ``check``; may build modules or tensors).
        reference: the package's implementation; called with each case's arguments.
        reference_name: how the pass message names the reference.
        outputs: names of the items when the function returns a tuple, for messages.
        tolerance: overrides ``DTYPE_TOLERANCE`` / ``NUMBER_TOLERANCE`` (``EXACT`` for rounding
            exercises, where a result is either the right number or a wrong one).
        unavailable: returns why the exercise cannot run here (e.g. no Triton), or None.
    """

    id: str
    title: str
    function: str
    signature: str
    task: str
    stub: str
    cases: Callable[[], Sequence[Case]]
    reference: Callable[..., Any]
    reference_name: str
    outputs: tuple[str, ...] = ()
    tolerance: Tolerance | None = None
    unavailable: Callable[[], str | None] = field(default=lambda: None)

    @property
    def chapter(self) -> int:
        return int(self.id.split(".")[0])

    def describe(self) -> str:
        """Title, signature and task as plain text."""
        return f"Code exercise {self.id}: {self.title}\n{self.signature}\n\n{self.task}"
