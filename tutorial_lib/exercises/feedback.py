"""Compare what the reader's function returned with what the package computes, and say in one
or two sentences what is wrong: a missing result, the wrong type, shape or dtype, or the first
wrong value (its index, the expected and the returned value, and the tolerance)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch

from .base import DTYPE_TOLERANCE, EXACT, NUMBER_TOLERANCE, Tolerance

__all__ = ["compare", "describe_value", "changed_inputs"]


def describe_value(value: Any) -> str:
    """A short description of a value's type: ``a float32 Tensor of shape (2, 3)``, ``a list``."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} Tensor of shape {tuple(value.shape)}"
    if value is None:
        return "None"
    return f"a {type(value).__name__}"


def _fmt(x: float) -> str:
    return f"{x:.9g}"


def _index(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        out.append(i)
    return tuple(reversed(out))


def _tolerance(dtype: torch.dtype, override: Tolerance | None) -> Tolerance:
    if override is not None:
        return override
    return DTYPE_TOLERANCE.get(dtype, EXACT)


def _compare_tensor(
    expected: torch.Tensor, got: Any, name: str, override: Tolerance | None
) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"{name}: expected {describe_value(expected)}, got {describe_value(got)}."
    if got.shape != expected.shape:
        return f"{name}: wrong shape: expected {tuple(expected.shape)}, got {tuple(got.shape)}."
    if got.dtype != expected.dtype:
        return f"{name}: wrong dtype: expected {expected.dtype}, got {got.dtype}."
    if got.device != expected.device:
        return f"{name}: wrong device: expected {expected.device}, got {got.device}."
    tol = _tolerance(expected.dtype, override)
    e = expected.detach().reshape(-1).to("cpu", torch.float64)
    g = got.detach().reshape(-1).to("cpu", torch.float64)
    ok = torch.isclose(g, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True)
    if bool(ok.all()):
        return None
    bad = (~ok).nonzero().reshape(-1)
    first = int(bad[0])
    where = _index(first, expected.shape)
    msg = (
        f"{name}: wrong value at index {where}: expected {_fmt(float(e[first]))}, "
        f"got {_fmt(float(g[first]))} ({tol}, {expected.dtype})."
    )
    if bad.numel() > 1:
        err = (g - e).abs().nan_to_num(nan=float("inf"))[bad]
        worst = int(bad[int(err.argmax())])
        msg += (
            f" {bad.numel()} of {e.numel()} elements are wrong; the largest error is at "
            f"{_index(worst, expected.shape)}: expected {_fmt(float(e[worst]))}, "
            f"got {_fmt(float(g[worst]))}."
        )
    return msg


def _compare_number(expected: float, got: Any, name: str, override: Tolerance | None) -> str | None:
    if isinstance(got, torch.Tensor):
        return (
            f"{name}: expected a Python number, got {describe_value(got)}; "
            "return a float (tensor.item() gives one)."
        )
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return f"{name}: expected a number, got {describe_value(got)}."
    tol = override or NUMBER_TOLERANCE
    e, g = float(expected), float(got)
    if g == e or abs(g - e) <= tol.atol + tol.rtol * abs(e):
        return None
    return f"{name}: wrong value: expected {_fmt(e)}, got {_fmt(g)} ({tol})."


def compare(
    expected: Any,
    got: Any,
    name: str = "result",
    tolerance: Tolerance | None = None,
    item_names: Sequence[str] = (),
) -> str | None:
    """None if ``got`` matches ``expected``, else what is wrong (naming ``name``). Tensors,
    numbers, strings, and tuples or lists of them (compared item by item; ``item_names`` name
    the items of a returned tuple, else they are ``name[i]``)."""
    if got is None and expected is not None:
        return f"{name}: your function returned None. Did it forget to `return` its result?"
    if isinstance(expected, torch.Tensor):
        return _compare_tensor(expected, got, name, tolerance)
    if isinstance(expected, (tuple, list)):
        kind = type(expected).__name__
        what = f" ({', '.join(item_names)})" if item_names else ""
        if not isinstance(got, (tuple, list)):
            return (
                f"{name}: expected a {kind} of {len(expected)} items{what}, "
                f"got {describe_value(got)}."
            )
        if len(got) != len(expected):
            return f"{name}: expected {len(expected)} items{what}, got {len(got)}."
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            item = item_names[i] if i < len(item_names) else f"{name}[{i}]"
            problem = compare(e, g, item, tolerance)
            if problem:
                return problem
        return None
    if isinstance(expected, str):
        return None if got == expected else f"{name}: expected {expected!r}, got {got!r}."
    if isinstance(expected, numbers.Real) and not isinstance(expected, bool):
        return _compare_number(float(expected), got, name, tolerance)
    return None if got == expected else f"{name}: expected {expected!r}, got {got!r}."


def changed_inputs(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Names of the tensor arguments whose values differ between ``before`` and ``after``."""
    changed = []
    for name, value in before.items():
        new = after[name]
        if not (isinstance(value, torch.Tensor) and isinstance(new, torch.Tensor)):
            continue
        a, b = value.detach().to("cpu", torch.float64), new.detach().to("cpu", torch.float64)
        if a.shape != b.shape or not bool(torch.isclose(a, b, 0.0, 0.0, equal_nan=True).all()):
            changed.append(name)
    return changed
