"""The exercises of each chapter live in book/exercises/chNN.md.

Each such file is MyST markdown with sphinx-exercise directives; its notebook includes it from one
markdown cell. The computed answers of the solutions are doctest blocks, run here, so a solution's
numbers cannot drift from the code. Every chapter must have its file.
"""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).parents[1]
EXERCISES = ROOT / "book" / "exercises"
CHAPTERS = ROOT / "book" / "chapters"
EXERCISE_FILES = sorted(EXERCISES.glob("ch*.md"))

LABEL = re.compile(r"^:label:\s*(ch(\d+)-ex\d+)\s*$", re.MULTILINE)
SOLUTION = re.compile(r"^(?:`{3,}|:{3,})\{solution\}\s+(ch\d+-ex\d+)\s*$", re.MULTILINE)
INCLUDE = re.compile(r"(?:`{3,}|:{3,})\{include\}\s+\.\./exercises/(ch\d+)\.md")


def _notebook_for(md: Path) -> Path:
    nn = md.stem.removeprefix("ch")
    matches = sorted(CHAPTERS.glob(f"{nn}_*.ipynb"))
    assert len(matches) == 1, f"{md.name}: expected one notebook {nn}_*.ipynb, found {matches}"
    return matches[0]


def _markdown_sources(nb_path: Path) -> list[str]:
    nb = nbformat.read(nb_path, as_version=4)
    return [cell.source for cell in nb.cells if cell.cell_type == "markdown"]


@pytest.mark.parametrize("path", EXERCISE_FILES, ids=lambda p: p.name)
def test_solution_doctests(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = doctest.testfile(
        str(path),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        raise_on_error=False,
    )
    report = capsys.readouterr().out
    assert result.attempted > 0, f"{path.name}: no doctest examples (every chapter computes some)"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed:\n{report}"


@pytest.mark.parametrize("path", EXERCISE_FILES, ids=lambda p: p.name)
def test_every_exercise_has_a_solution(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    labels = [m.group(1) for m in LABEL.finditer(text)]
    solutions = [m.group(1) for m in SOLUTION.finditer(text)]
    assert labels, f"{path.name} has no exercise labels"
    chapter = int(path.stem.removeprefix("ch"))
    assert all(int(m.group(2)) == chapter for m in LABEL.finditer(text)), labels
    assert len(set(labels)) == len(labels), f"duplicate labels in {path.name}: {labels}"
    assert sorted(solutions) == sorted(labels), (
        f"{path.name}: labels {labels}, solutions {solutions}"
    )
    assert "{solution-start}" not in text and "{solution-end}" not in text


@pytest.mark.parametrize("path", EXERCISE_FILES, ids=lambda p: p.name)
def test_notebook_includes_its_exercises(path: Path) -> None:
    sources = _markdown_sources(_notebook_for(path))
    includes = [(i, m.group(1)) for i, s in enumerate(sources) for m in INCLUDE.finditer(s)]
    assert [name for _, name in includes] == [path.stem], includes
    assert all("{exercise}" not in s and "{solution" not in s for s in sources)


@pytest.mark.parametrize(
    "nb_path", sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.stem
)
def test_included_exercise_files_exist(nb_path: Path) -> None:
    """Every chapter includes its own exercises file, and it exists."""
    sources = _markdown_sources(nb_path)
    names = [m.group(1) for s in sources for m in INCLUDE.finditer(s)]
    assert names == [f"ch{nb_path.stem[:2]}"], names
    assert (EXERCISES / f"{names[0]}.md").exists()


def test_shown_but_not_run_code_still_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """ch8-ex1's solution code trains, so it is a plain block, not a doctest; run it here, with
    the names the notebook's setup cell defines, so it cannot silently break."""
    import torch

    from tutorial_lib import get_preset
    from tutorial_lib.bench import ladder

    text = (EXERCISES / "ch08.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"expected ch8-ex1's one python block, found {len(blocks)}"
    namespace = {"ladder": ladder, "preset": get_preset("ci"), "device": torch.device("cpu")}
    exec(compile(blocks[0], "ch08.md:ch8-ex1", "exec"), namespace)  # noqa: S102
    out = capsys.readouterr().out
    assert "rung 4 (Triton) runs at" in out, out
