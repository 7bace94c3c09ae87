#!/usr/bin/env python3
"""Chapter notebooks as reveal.js slide decks, offline.

Two subcommands:

``python scripts/slides.py tag [--check] NOTEBOOK...``
    Give every cell a ``slideshow.slide_type`` (the metadata Jupyter's slide view and nbconvert
    read). Cells that already have one keep it, so an author can hand-tune a deck (``skip`` a
    cell, turn prose into speaker ``notes``). The defaults: the title cell and every ``##``
    section start a new slide, ``###`` subsections a vertical sub-slide, a code cell a sub-slide
    of its own (code and output together), and other cells continue the slide they follow.
    With ``--check`` nothing is written; the exit status is 1 if some cell lacks a type.

``python scripts/slides.py build SRC_DIR OUT_DIR [--vendor book/_vendor]``
    Export every ``*.ipynb`` in SRC_DIR (``make slides`` passes the executed copies, so the
    decks show outputs) to ``OUT_DIR/<name>.slides.html`` with nbconvert's SlidesExporter and
    the template in ``book/_slides/offline_reveal``, which loads reveal.js, RequireJS, MathJax
    and the widget renderer from ``OUT_DIR/_vendor`` (copied from the folder ``make vendor``
    fills from npm): no CDN. MyST syntax that nbconvert's Markdown renderer does not know
    (roles such as ``{cite}`` and directives such as ``{admonition}``) is turned into plain
    Markdown on the way, figure captions (cell metadata in the book) are shown under their
    plots, and the Exercises cell (a MyST ``{include}``) is left out. An ``index.html`` lists
    the decks.
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE_DIR = ROOT / "book" / "_slides"
TEMPLATE_NAME = "offline_reveal"
# Make the widget renderer work offline (see the files); shared with the HTML book.
WIDGETS_JS = [
    ROOT / "book" / "_ext" / "js" / n
    for n in ("widgets_requirejs_paths.js", "widgets_mathjax2_shim.js")
]
# Vendored packages a deck loads, relative to the vendor folder.
VENDORED = ("reveal.js", "requirejs", "mathjax", "html-manager")
SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "skip", "notes")


# --- tagging ---------------------------------------------------------------------------------


def default_slide_type(cell: nbformat.NotebookNode, index: int) -> str:
    """The slide type a cell gets when its author has not chosen one."""
    if index == 0:
        return "slide"
    if cell.cell_type == "code":
        return "subslide"
    text = cell.source.lstrip()
    if text.startswith("## Exercises"):
        return "skip"  # a MyST {include}: it renders in the book, not in nbconvert
    if text.startswith("## ") or text.startswith("# "):
        return "slide"
    if text.startswith("### "):
        return "subslide"
    return "-"


def missing_types(nb: nbformat.NotebookNode) -> list[int]:
    """Indices of the cells without a valid slide type."""
    return [
        i
        for i, cell in enumerate(nb.cells)
        if cell.metadata.get("slideshow", {}).get("slide_type") not in SLIDE_TYPES
    ]


def tag(nb: nbformat.NotebookNode) -> int:
    """Fill in missing slide types in place; returns how many cells were tagged."""
    missing = missing_types(nb)
    for i in missing:
        nb.cells[i].metadata.setdefault("slideshow", {})["slide_type"] = default_slide_type(
            nb.cells[i], i
        )
    return len(missing)


# --- MyST to plain Markdown ------------------------------------------------------------------

_ROLE = re.compile(r"\{(\w+(?::\w+)?)\}`([^`]*)`")
_FENCE = re.compile(r"^(```+|:::+)\{(\w[\w-]*)\}[ \t]*(.*)$")
_TARGET = re.compile(r"<([^<>]+)>\s*$")
# A link to another chapter's notebook works in the book and in Jupyter, not next to a deck.
_NOTEBOOK_LINK = re.compile(r"\[([^\]]+)\]\((?![a-z]+:)[^)\s]*\.ipynb(?:#[^)]*)?\)")


def _role_text(role: str, content: str) -> str:
    target = _TARGET.search(content)
    label = content[: target.start()].strip() if target else content.strip()
    if role in ("cite", "cite:p", "cite:t"):
        return f"[{', '.join(k.strip() for k in content.split(','))}]"
    if role in ("numref", "ref", "doc", "term", "eq"):
        if role == "numref" and not target:
            return "(see the book)"
        if role == "doc" and not target:
            return f"*{Path(content).name.replace('_', ' ')}*"
        return label or content
    return f"`{label or content}`"


def myst_to_markdown(text: str) -> str:
    """Rewrite the MyST parts of a Markdown cell into Markdown that nbconvert renders."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            line = _ROLE.sub(lambda m: _role_text(m.group(1), m.group(2)), lines[i])
            out.append(_NOTEBOOK_LINK.sub(r"\1", line))
            i += 1
            continue
        fence, name, argument = match.groups()
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence[:3]):
            if not re.match(r"^:[\w-]+:", lines[i]):  # directive options
                body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if name in ("code-cell", "code", "code-block"):
            out += [f"```{argument or 'python'}", *body, "```"]
        elif name in ("math",):
            out += ["$$", *body, "$$"]
        elif name in ("include", "bibliography", "glossary", "toctree", "tableofcontents"):
            continue
        else:  # admonitions, notes, tips, figures ...
            title = argument.strip() or name.capitalize()
            quoted = [
                f"> {line}" if line else ">"
                for line in myst_to_markdown("\n".join(body)).split("\n")
            ]
            out += [
                f"> **{_ROLE.sub(lambda m: _role_text(m.group(1), m.group(2)), title)}**",
                ">",
                *quoted,
            ]
    return "\n".join(out)


# --- export ----------------------------------------------------------------------------------


def export_deck(nb_path: Path, out_dir: Path) -> Path:
    """Write ``out_dir/<stem>.slides.html`` for one notebook; returns its path."""
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    nb = nbformat.read(nb_path, as_version=4)
    tag(nb)  # an untagged cell would otherwise vanish from the deck
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = myst_to_markdown(cell.source)
        cells.append(cell)
        caption = cell.metadata.get("mystnb", {}).get("figure", {}).get("caption")
        if cell.cell_type == "code" and caption:  # the book's figure caption, under the plot
            note = nbformat.v4.new_markdown_cell(f"*{myst_to_markdown(caption.strip())}*")
            note.metadata["slideshow"] = {"slide_type": "-"}
            cells.append(note)
    nb.cells = cells
    c = Config()
    c.TemplateExporter.extra_template_basedirs = [str(TEMPLATE_DIR)]
    c.SlidesExporter.template_name = TEMPLATE_NAME
    c.SlidesExporter.reveal_url_prefix = "_vendor/reveal.js"
    c.SlidesExporter.reveal_theme = "white"
    c.SlidesExporter.reveal_number = "c/t"
    c.SlidesExporter.reveal_width = "1280"
    c.SlidesExporter.reveal_height = "800"
    c.SlidesExporter.require_js_url = "_vendor/requirejs/require.js"
    c.SlidesExporter.mathjax_url = "_vendor/mathjax/es5/tex-chtml.js"
    c.SlidesExporter.widget_renderer_url = "_vendor/html-manager/dist/embed-amd.js"
    c.SlidesExporter.font_awesome_url = ""
    resources = {
        "metadata": {"name": nb_path.stem},
        "widgets_offline_js": "\n".join(p.read_text(encoding="utf-8") for p in WIDGETS_JS),
    }
    body, _ = SlidesExporter(config=c).from_notebook_node(nb, resources=resources)
    target = out_dir / f"{nb_path.stem}.slides.html"
    target.write_text(body, encoding="utf-8")
    return target


def copy_vendor(vendor: Path, out_dir: Path) -> None:
    missing = [name for name in VENDORED if not (vendor / name).is_dir()]
    if missing:
        raise SystemExit(
            f"slides: {', '.join(missing)} missing from {vendor}; run `make vendor` first "
            "(it fetches them from npm once)."
        )
    for name in VENDORED:
        dest = out_dir / "_vendor" / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(vendor / name, dest)


def write_index(decks: list[Path], out_dir: Path) -> Path:
    items = "\n".join(
        f'<li><a href="{html.escape(d.name)}">{html.escape(d.name.removesuffix(".slides.html"))}</a></li>'
        for d in decks
    )
    index = out_dir / "index.html"
    index.write_text(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>Slides: Fast Transformer Training on Hopper</title></head>\n"
        "<body><h1>Slides</h1>\n<p>One reveal.js deck per chapter. Arrow keys move between "
        "slides, <kbd>s</kbd> opens the speaker view.</p>\n"
        f"<ul>\n{items}\n</ul></body></html>\n",
        encoding="utf-8",
    )
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_tag = sub.add_parser("tag", help="give every cell a slide type")
    p_tag.add_argument("notebooks", nargs="+", type=Path)
    p_tag.add_argument("--check", action="store_true", help="write nothing; fail if untagged")
    p_build = sub.add_parser("build", help="export the decks")
    p_build.add_argument("src", type=Path)
    p_build.add_argument("out", type=Path)
    p_build.add_argument("--vendor", type=Path, default=ROOT / "book" / "_vendor")
    args = parser.parse_args(argv)

    if args.command == "tag":
        untagged = 0
        for path in args.notebooks:
            nb = nbformat.read(path, as_version=4)
            if args.check:
                missing = missing_types(nb)
                if missing:
                    print(f"{path}: cells {missing} have no slide type (run scripts/slides.py tag)")
                untagged += len(missing)
            elif tag(nb):
                nbformat.write(nb, path)
                print(f"tagged {path}")
        return 1 if untagged else 0

    notebooks = sorted(args.src.glob("*.ipynb"))
    if not notebooks:
        raise SystemExit(f"slides: no notebooks in {args.src}")
    args.out.mkdir(parents=True, exist_ok=True)
    copy_vendor(args.vendor, args.out)
    decks = [export_deck(path, args.out) for path in notebooks]
    index = write_index(decks, args.out)
    print(f"slides: {len(decks)} decks in {args.out} (open {index})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
