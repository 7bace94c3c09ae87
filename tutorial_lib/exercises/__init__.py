"""Exercises in which the reader writes code, one or more per chapter, and their checker.

In a notebook::

    from tutorial_lib import exercises

    print(exercises.stub("4.1"))             # the cell the reader edits
    exercises.check("4.1", quantize_e4m3)    # compare with tutorial_lib.fp8.quantize

- ``checker``: ``check``, ``ExerciseError``, ``CheckResult``, the registry (``list_exercises``,
  ``get_exercise``, ``stub``);
- ``base``: ``Exercise`` (title, signature, task, stub, cases, reference) and tolerances;
- ``compare``: what is wrong with a result, in a sentence;
- ``ch01`` .. ``ch11``: one file per chapter, holding its exercises;
- ``solutions``: worked solutions (``solution``, ``solution_source``), kept apart so that reading
  a chapter's checker does not give the answer away.
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
from .solutions import solution, solution_source

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
    "solution",
    "solution_source",
]
