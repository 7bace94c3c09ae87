"""Exercises in which the reader writes code, one or more per chapter, and their checker.

In a notebook::

    from tutorial_lib import exercises

    print(exercises.stub("4.1"))             # the cell the reader edits
    exercises.check("4.1", quantize_e4m3)    # compare with tutorial_lib.fp8.quantize

- ``checker``: ``check``, ``ExerciseError``, ``CheckResult``, the registry (``list_exercises``,
  ``get_exercise``, ``stub``);
- ``base``: ``Exercise`` (title, signature, task, stub, cases, reference) and tolerances;
- ``feedback``: what is wrong with a result, in a sentence;
- ``ch01`` .. ``ch11``: one file per chapter, holding its exercises.

The worked solutions are not in the package: each chapter shows its own under the exercise,
and the tests keep them (``tests/exercise_solutions.py``) and check that they pass.
"""

from .base import Case, Exercise, Tolerance
from .checker import (
    REGISTRY,
    CheckResult,
    ExerciseError,
    check,
    get_exercise,
    list_exercises,
    notebook_cells,
    stub,
)

__all__ = [
    "Case",
    "Exercise",
    "Tolerance",
    "REGISTRY",
    "CheckResult",
    "ExerciseError",
    "check",
    "get_exercise",
    "list_exercises",
    "stub",
    "notebook_cells",
]
