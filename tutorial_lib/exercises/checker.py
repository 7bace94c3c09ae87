"""Check a reader's function against the package's own implementation.

``check("4.1", quantize_e4m3)`` runs the function on the exercise's seeded cases (odd shapes,
ties, specials), runs the package's reference on copies of the same inputs, and compares:

- every case matches: prints a short pass message and returns a ``CheckResult``;
- the function still raises ``NotImplementedError`` (the untouched stub): prints "not written
  yet" and returns a result with ``passed == False``, so a notebook with stubs in place still
  runs from top to bottom;
- the exercise cannot run here (chapter 7 without Triton): says why, returns a result;
- anything else raises ``ExerciseError`` (an ``AssertionError``) naming the case and the problem:
  None returned, wrong type, shape or dtype, the first wrong value with its index and the
  tolerance, an input changed in place, or the exception the function raised (with its own
  frames, not the checker's).
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11
from .base import Case, Exercise
from .feedback import changed_inputs, compare

__all__ = [
    "ExerciseError",
    "CheckResult",
    "REGISTRY",
    "get_exercise",
    "check",
]

REGISTRY: dict[str, Exercise] = {
    ex.id: ex
    for module in (ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch09, ch10, ch11)
    for ex in module.EXERCISES
}

_HERE = Path(__file__).resolve().parent
_SEED = 0  # check() seeds torch inside fork_rng: cases are the same on every call


class ExerciseError(AssertionError):
    """The reader's function gave a wrong result (or raised); the message says which case and
    what is wrong. ``result`` is the failed ``CheckResult``."""

    def __init__(self, message: str, result: CheckResult | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class CheckResult:
    """What ``check`` found. ``status``: "passed", "failed", "not written" or "unavailable"."""

    exercise_id: str
    status: str
    message: str
    cases_passed: int
    cases_total: int

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __repr__(self) -> str:
        return (
            f"CheckResult({self.exercise_id!r}, {self.status}, "
            f"{self.cases_passed}/{self.cases_total} cases)"
        )

    def _ipython_display_(self) -> None:
        """Show nothing as a cell's value: ``check`` has printed the message already, so a
        one-line check cell prints one line."""


def get_exercise(exercise_id: str) -> Exercise:
    """The exercise with this id ("4.1"); a ``KeyError`` lists the known ids."""
    try:
        return REGISTRY[str(exercise_id)]
    except KeyError:
        known = ", ".join(REGISTRY)
        raise KeyError(f"No exercise {exercise_id!r}; the exercises are {known}.") from None


def _reader_frames(exc: BaseException, keep: int = 4) -> str:
    """The traceback of the reader's exception without the checker's own frames."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if Path(f.filename).resolve().parent != _HERE
    ]
    lines = []
    for f in frames[-keep:]:
        lines.append(f'  File "{f.filename}", line {f.lineno}, in {f.name}')
        if f.line:
            lines.append(f"    {f.line.strip()}")
    return "\n".join(lines)


def _raised(exc: BaseException) -> str:
    frames = _reader_frames(exc)
    return f"your function raised {type(exc).__name__}: {exc}" + (f"\n{frames}" if frames else "")


def _raised_by(fn: Callable[..., Any], exc: BaseException) -> bool:
    """Whether ``exc`` was raised in ``fn``'s own body (True if that cannot be told)."""
    code = getattr(fn, "__code__", None)
    tb = exc.__traceback__
    if code is None or tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code is code


def _run_case(ex: Exercise, fn: Callable[..., Any], case: Case) -> tuple[str, str | None]:
    """("ok" | "not written" | "failed", problem) for one case."""
    mine = copy.deepcopy(case.args)
    try:
        got = fn(*mine.values())
    except NotImplementedError as exc:
        if _raised_by(fn, exc):  # the stub's own `raise`, not a torch op missing a kernel
            return "not written", str(exc) or None
        return "failed", _raised(exc)
    except Exception as exc:
        return "failed", _raised(exc)
    expected = ex.reference(*copy.deepcopy(case.args).values())
    problem = compare(expected, got, tolerance=ex.tolerance, item_names=ex.outputs)
    if problem is None:
        changed = changed_inputs(case.args, mine)
        if changed:
            problem = (
                f"your function changed its input {', '.join(changed)} in place; "
                "compute new tensors and leave the inputs as they were."
            )
    return ("failed", problem) if problem else ("ok", None)


def _outcome(ex: Exercise, fn: Callable[..., Any]) -> CheckResult:
    name = getattr(fn, "__name__", ex.function)
    head = f"Code exercise {ex.id} ({ex.title})"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_SEED)
        cases = list(ex.cases())
        n = len(cases)
        for i, case in enumerate(cases):
            status, problem = _run_case(ex, fn, case)
            if status == "not written":
                detail = f" ({problem})" if problem else ""
                msg = (
                    f"{head}: not written yet: {name} raises NotImplementedError{detail}. "
                    "Write it (and delete its `raise NotImplementedError` line), run its cell, "
                    "then this check again."
                )
                return CheckResult(ex.id, "not written", msg, i, n)
            if status == "failed":
                msg = f"{head} failed on case {i + 1} of {n}: {case.label}\n  {problem}"
                return CheckResult(ex.id, "failed", msg, i, n)
    msg = f"{head} passed: {name} matches {ex.reference_name} on all {n} cases."
    return CheckResult(ex.id, "passed", msg, n, n)


def check(exercise_id: str, fn: Callable[..., Any]) -> CheckResult:
    """Run the reader's ``fn`` for exercise ``exercise_id`` against the package's reference.

    Prints one line and returns a ``CheckResult`` when ``fn`` passes, is still the stub
    (``NotImplementedError``), or the exercise cannot run on this machine. Raises
    ``ExerciseError`` when ``fn`` returns a wrong result or raises.
    """
    ex = get_exercise(exercise_id)
    if not callable(fn):
        raise ExerciseError(
            f"check({ex.id!r}, ...) needs your function itself, e.g. "
            f"check({ex.id!r}, {ex.function}); got {type(fn).__name__}."
        )
    reason = ex.unavailable()
    if reason is not None:
        result = CheckResult(
            ex.id, "unavailable", f"Code exercise {ex.id} cannot run here: {reason}.", 0, 0
        )
    else:
        result = _outcome(ex, fn)
    if result.status == "failed":
        raise ExerciseError(result.message, result) from None
    print(result.message)
    return result
