#!/usr/bin/env python3
"""The first code cell of every chapter: it installs tutorial_lib where the package is missing.

A chapter opened from the book's Colab or Binder launch button starts in a kernel that may not
have this book's package. ``INSTALL_CELL`` below is the canonical text of the cell that installs
it there, and does nothing where ``tutorial_lib`` is importable already (``make``'s ``.venv``, and
Binder, whose image installs it from ``binder/requirements.txt``). After a fresh install the
import caches are invalidated, so the next cell can import the package without a kernel restart.

Usage:
    python scripts/notebook_header.py check book/chapters/*.ipynb   # exit 1 if one differs
    python scripts/notebook_header.py apply book/chapters/*.ipynb   # insert it, or update it

``tests/test_launch.py`` checks that every chapter starts with this cell, that ``PACKAGE`` names
pyproject's project and ``repository.url``@``repository.branch`` of ``book/_config.yml``, and
runs the cell offline in a fresh virtual environment.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import nbformat

INSTALL_CELL = """\
# Colab and Binder start without this book's package: install it when missing.
import importlib.util
import subprocess
import sys

REPO = "https://github.com/tutorial-lib/hopper-training-book"
PACKAGE = f"tutorial_lib @ git+{REPO}@main"
if importlib.util.find_spec("tutorial_lib") is None:
    print("tutorial_lib not found; installing", PACKAGE)
    pip = [sys.executable, "-m", "pip", "install", "-q", PACKAGE]
    subprocess.check_call(pip)
    importlib.invalidate_caches()"""

# Its first line marks an older copy of the cell, which `apply` updates instead of adding one.
MARKER = INSTALL_CELL.splitlines()[0]

# A new cell has its code folded on the book's HTML pages.
NEW_CELL_METADATA = {"tags": ["hide-input"]}


def first_code_cell(nb: nbformat.NotebookNode) -> int | None:
    """Index of the notebook's first code cell, or None when it has none."""
    return next((i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"), None)


def problem(nb: nbformat.NotebookNode) -> str | None:
    """Why the notebook does not start with ``INSTALL_CELL``, or None when it does."""
    index = first_code_cell(nb)
    if index is None:
        return "has no code cell"
    if nb.cells[index].source != INSTALL_CELL:
        return f"first code cell (cell {index}) is not the install cell"
    return None


def apply(nb: nbformat.NotebookNode) -> bool:
    """Make ``INSTALL_CELL`` the first code cell, in place; returns whether anything changed.

    A first code cell that starts with ``MARKER`` is an older copy and gets the current text
    (its metadata kept); otherwise a new cell goes in front of the first code cell."""
    if problem(nb) is None:
        return False
    index = first_code_cell(nb)
    if index is not None and nb.cells[index].source.startswith(MARKER):
        nb.cells[index].source = INSTALL_CELL
        return True
    cell = nbformat.v4.new_code_cell(INSTALL_CELL, metadata=copy.deepcopy(NEW_CELL_METADATA))
    nb.cells.insert(len(nb.cells) if index is None else index, cell)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("check", "apply"))
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    failed = 0
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        if args.command == "apply":
            if apply(nb):
                nbformat.write(nb, path)
                print(f"{path}: install cell written")
        elif why := problem(nb):
            print(f"{path}: {why} (run scripts/notebook_header.py apply)")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
