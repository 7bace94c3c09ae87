#!/usr/bin/env python3
"""Copy the book's sources to a build folder, where the notebooks are executed once.

Usage: ``python scripts/stage_book.py SRC DEST`` (the Makefile passes ``book book/_executed``).

Why: `make test` executes every notebook under nbmake, and the HTML book needs the same
notebooks with their outputs. Rather than executing them twice (nbmake, then Jupyter Book), the
Makefile runs nbmake with ``--overwrite`` on this copy, which writes the outputs (figures, widget
state) into the copied notebooks, and then builds the HTML from the copy with Jupyter Book's
execution switched off. The committed notebooks stay output-free.

DEST is replaced entirely. ``_build`` folders and checkpoints are not copied; the vendored
JavaScript (``_vendor``, tens of MB) is linked, not copied. In the copy's ``_config.yml``,
``execute_notebooks`` becomes ``"off"``: the build fails instead of silently executing a notebook
that nbmake did not run.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

SKIP = ("_build", "_executed", "_vendor", ".ipynb_checkpoints", "__pycache__", ".jupyter_cache")
_EXECUTE = re.compile(r"^(\s*execute_notebooks:\s*)\S+", re.MULTILINE)


def stage(src: Path, dest: Path) -> Path:
    src, dest = src.resolve(), dest.resolve()
    if not (src / "_config.yml").is_file():
        raise SystemExit(f"stage_book: {src} is not a Jupyter Book folder (no _config.yml)")
    if src == dest or dest in src.parents:
        raise SystemExit(
            f"stage_book: DEST {dest} holds SRC {src}; replacing it would delete the sources"
        )
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*SKIP))
    if (src / "_vendor").is_dir():
        (dest / "_vendor").symlink_to(src / "_vendor", target_is_directory=True)
    config = dest / "_config.yml"
    text, count = _EXECUTE.subn(r'\g<1>"off"', config.read_text(encoding="utf-8"))
    if count != 1:
        raise SystemExit(f"stage_book: no single `execute_notebooks:` line in {config}")
    config.write_text(text, encoding="utf-8")
    return dest


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    dest = stage(Path(argv[0]), Path(argv[1]))
    notebooks = len(list(dest.rglob("*.ipynb")))
    print(f"stage_book: copied {argv[0]} to {dest} ({notebooks} notebooks, execution off)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
