"""Argument checks shared by the whole package: one definition, one meaning, one message.

An *integer* here is a Python ``int`` (or a NumPy integer), never a ``bool`` and never a float
such as ``4.0``: a count that arrives as a float is almost always a bug upstream (a division
that should have been ``//``), so it is refused rather than silently truncated.
"""

from __future__ import annotations

import numbers

__all__ = ["check_int", "check_positive_int", "check_positive_ints"]


def check_int(value: object, name: str, minimum: int) -> int:
    """Return ``value`` if it is an integer ``>= minimum``; else raise ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        want = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {want}, got {value!r}.")
    return int(value)


def check_positive_int(value: object, name: str) -> int:
    """``check_int(value, name, 1)``: counts such as layers, GPUs, steps or samples."""
    return check_int(value, name, 1)


def check_positive_ints(obj: object, names: tuple[str, ...]) -> None:
    """Check the attributes ``names`` of a config object; errors read ``Type.field must be ...``."""
    for name in names:
        check_positive_int(getattr(obj, name), f"{type(obj).__name__}.{name}")
