#!/usr/bin/env python3
"""Show the package's own source in the notebooks, copied from the package so it cannot drift.

A chapter shows its core logic (``GPT.forward``, ``quantize``, ``FP8Linear``, ``plan``...) in a
markdown cell whose metadata names the objects::

    "metadata": {"tutorial_lib_source": ["tutorial_lib.model:GPT.forward"]}

This script writes that cell's text: a link to the file and lines on the code-hosting site, and
the source in a fenced ``python`` block. Because the code is in the notebook file itself, it reads
the same in the rendered book, in Jupyter, and in the notebook file shown without outputs on the
code-hosting site (an output of ``inspect.getsource`` shows in the first two only).

Usage::

    python scripts/sync_sources.py [--check] NOTEBOOK_OR_FOLDER...

Without ``--check`` the cells are rewritten in place (``make sync``). With ``--check`` nothing
is written and the exit status is 1 if a cell differs from the package (``make lint`` and the
unit tests run this). ``scripts/stage_book.py`` rewrites the staged copy as well, so the built
book shows the package as it is at build time.

Options per cell, in metadata ``tutorial_lib_source_options``: ``{"docstring": false}`` leaves
docstrings out of the shown code (the line numbers in the link still cover the whole object).
A module's docstring is named ``module:__doc__`` and shown as text; ``{"from": ..., "until":
...}`` cut it to the lines from the one starting with ``from`` up to the one starting with
``until``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parents[1]
KEY = "tutorial_lib_source"
OPTIONS = "tutorial_lib_source_options"
_REPO = re.compile(
    r"^repository:\s*\n\s+url:\s*(\S+)\s*\n(?:\s+\w+:.*\n)*?\s+branch:\s*(\S+)", re.M
)


def repository_url(config: Path = ROOT / "book" / "_config.yml") -> str:
    """``<url>/blob/<branch>`` from the book's ``repository`` settings."""
    match = _REPO.search(config.read_text(encoding="utf-8"))
    if not match:
        raise SystemExit(f"sync_sources: no repository url and branch in {config}")
    return f"{match.group(1).rstrip('/')}/blob/{match.group(2)}"


def resolve(spec: str) -> Any:
    """The object named ``module:qualname`` (e.g. ``tutorial_lib.model:GPT.forward``)."""
    module_name, sep, qualname = spec.partition(":")
    if not sep or not qualname:
        raise ValueError(f"{spec!r}: write module:qualname, e.g. tutorial_lib.model:GPT.forward")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            raise ValueError(f"{spec!r}: {module_name} has no {qualname}") from None
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        obj = obj.fget
    if not callable(obj) or not hasattr(obj, "__code__") and not inspect.isclass(obj):
        obj = getattr(obj, "fn", obj)  # a Triton kernel: @triton.jit keeps the function in .fn
    return inspect.unwrap(obj)


def _without_docstrings(code: str) -> str:
    """``code`` with the docstring of every function and class in it removed."""
    tree = ast.parse(code)
    drop: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                end = first.end_lineno or first.lineno
                drop.update(range(first.lineno, end + 1))
    lines = code.splitlines()
    return "\n".join(line for i, line in enumerate(lines, start=1) if i not in drop)


def render(specs: list[str], options: dict[str, Any] | None = None, base: str = "") -> str:
    """The markdown a source cell holds: per object, a linked caption and its code."""
    options = options or {}
    base = base or repository_url()
    parts = []
    for spec in specs:
        if spec.endswith(":__doc__"):
            parts.append(_render_module_doc(spec, options, base))
            continue
        obj = resolve(spec)
        lines, start = inspect.getsourcelines(obj)
        path = Path(inspect.getsourcefile(obj) or "").resolve().relative_to(ROOT)
        end = start + len(lines) - 1
        code = textwrap.dedent("".join(lines)).rstrip()
        if options.get("docstring") is False:
            code = _without_docstrings(code)
        name = spec.partition(":")[2]
        url = f"{base}/{path.as_posix()}#L{start}-L{end}"
        parts.append(
            f"`{name}`, from [`{path.as_posix()}`]({url}) (lines {start} to {end}):\n\n"
            f"```python\n{code}\n```"
        )
    return "\n\n".join(parts)


def _render_module_doc(spec: str, options: dict[str, Any], base: str) -> str:
    """A module's docstring (``module:__doc__``) as text, cut to the part from the line that
    starts with ``options["from"]`` up to the one that starts with ``options["until"]``."""
    module = importlib.import_module(spec.partition(":")[0])
    path = Path(inspect.getsourcefile(module) or "").resolve()
    node = ast.parse(path.read_text(encoding="utf-8")).body[0]
    doc = inspect.getdoc(module)
    if doc is None or not isinstance(node, ast.Expr):
        raise ValueError(f"{spec!r}: the module has no docstring")
    lines = doc.splitlines()
    first, last = 0, len(lines)
    for key, bound in (("from", "start"), ("until", "end")):
        marker = options.get(key)
        if marker is None:
            continue
        hits = [i for i, line in enumerate(lines) if line.startswith(marker)]
        if not hits:
            raise ValueError(f"{spec!r}: no docstring line starts with {marker!r} ({key})")
        if bound == "start":
            first = hits[0]
        else:
            last = hits[0]
    text = "\n".join(lines[first:last]).strip()
    rel = path.relative_to(ROOT).as_posix()
    url = f"{base}/{rel}#L{node.lineno}-L{node.end_lineno}"
    return f"From the docstring of [`{rel}`]({url}):\n\n```text\n{text}\n```"


def sync(nb: nbformat.NotebookNode, base: str = "") -> list[int]:
    """Rewrite the source cells of ``nb`` in place; returns the indices of the cells changed."""
    changed = []
    for i, cell in enumerate(nb.cells):
        specs = cell.metadata.get(KEY)
        if not specs:
            continue
        if cell.cell_type != "markdown":
            raise ValueError(f"cell {i}: {KEY} belongs on a markdown cell, not {cell.cell_type}")
        text = render(list(specs), dict(cell.metadata.get(OPTIONS, {})), base)
        if cell.source != text:
            cell.source = text
            changed.append(i)
    return changed


def notebooks(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        found += sorted(p.glob("*.ipynb")) if p.is_dir() else [p]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on drift")
    args = parser.parse_args(argv)
    base = repository_url()
    stale = []
    for path in notebooks(args.paths):
        nb = nbformat.read(path, as_version=4)
        changed = sync(nb, base)
        if changed and args.check:
            stale.append(f"{path} (cells {', '.join(map(str, changed))})")
        elif changed:
            nbformat.write(nb, path)
            print(f"sync_sources: {path}: rewrote cells {changed}")
    if stale:
        print(
            "sync_sources: the package's source changed; these notebook cells show an old copy:\n  "
            + "\n  ".join(stale)
            + "\nRun `make sync` to copy the current source into them.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
