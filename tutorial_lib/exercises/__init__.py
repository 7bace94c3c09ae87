"""Exercises in which the reader writes code, one or more per chapter, and their checker.

In a notebook::

    from tutorial_lib import exercises

    print(exercises.get_exercise("4.1").stub)  # the cell the reader edits
    exercises.check("4.1", quantize_e4m3)      # compare with tutorial_lib.fp8.quantize

- ``checker``: ``check``, ``ExerciseError``, ``CheckResult``, the registry (``REGISTRY``, in
  chapter order, and ``get_exercise``);
- ``base``: ``Exercise`` (title, signature, task, stub, cases, reference) and tolerances;
- ``feedback``: what is wrong with a result, in a sentence;
- ``ch01`` .. ``ch11``: one file per chapter, holding its exercises.

The worked solutions are not in the package: each chapter shows its own under the exercise,
and the tests keep them (``tests/exercise_solutions.py``) and check that they pass.
"""

from .checker import REGISTRY, ExerciseError, check, get_exercise

__all__ = ["REGISTRY", "ExerciseError", "check", "get_exercise"]
