#!/usr/bin/env python3
"""Workshop slide decks, one per chapter, built offline from outlines and executed notebooks.

``python scripts/slides.py build SRC_DIR OUT_DIR [--vendor book/_vendor] [--outlines DIR]``
    For every ``NN_*.ipynb`` in SRC_DIR (``make slides`` passes the executed copies, so the
    figures have their images), read the chapter's outline ``book/_slides/outline/chNN.yml``
    (``scripts/slide_outline.py`` documents it and the text budget), resolve its handles in the
    notebook (section headings for the speaker notes, figure names for the images) and write
    ``OUT_DIR/<notebook>.slides.html`` with the template ``book/_slides/deck.html.j2``: a
    reveal.js deck whose slides carry a headline and either one figure or a few bullets, and
    whose ``<aside class="notes">`` carry the chapter's prose. The images go to
    ``OUT_DIR/figures/``; reveal.js and MathJax are copied from the vendored folder (``make
    vendor`` fills it from npm) to ``OUT_DIR/_vendor``: nothing loads from a CDN. An
    ``index.html`` lists the decks. A missing heading or figure, a figure without an image, or a
    slide over the budget stops the build with a message naming the chapter and the slide.

``python scripts/slides.py check [NOTEBOOK_DIR]``
    Check every outline against the notebooks (default ``book/chapters``), without images:
    what the unit tests run on the committed notebooks, which carry no outputs.
"""

from __future__ import annotations

import argparse
import base64
import functools
import html
import re
import shutil
import sys
from pathlib import Path

import nbformat
from markdown_it import MarkdownIt
from markupsafe import Markup
from mdit_py_plugins.dollarmath import dollarmath_plugin

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
import slide_outline as so  # noqa: E402 - a sibling script, importable once its folder is on the path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "book" / "_slides" / "deck.html.j2"
OUTLINES = ROOT / "book" / "_slides" / "outline"
# Vendored packages a deck loads, relative to the vendor folder.
VENDORED = ("reveal.js", "mathjax")


# --- MyST to plain Markdown ------------------------------------------------------------------

_ROLE = re.compile(r"\{(\w+(?::\w+)?)\}`([^`]*)`")
_FENCE = re.compile(r"^(```+|:::+)\{(\w[\w-]*)\}[ \t]*(.*)$")
_TARGET = re.compile(r"<([^<>]+)>\s*$")
# A link to another chapter's notebook works in the book and in Jupyter, not next to a deck.
_NOTEBOOK_LINK = re.compile(r"\[([^\]]+)\]\((?![a-z]+:)[^)\s]*\.ipynb(?:#[^)]*)?\)")
_ANY_FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})(.*)$")
_LEFT_OUT = ("include", "literalinclude", "bibliography", "glossary", "toctree", "tableofcontents")


def _role_text(role: str, content: str) -> str:
    target = _TARGET.search(content)
    label = content[: target.start()].strip() if target else content.strip()
    if role in ("cite", "cite:p", "cite:t"):
        return f"[{', '.join(k.strip() for k in content.split(','))}]"
    if role in ("numref", "ref", "doc", "term", "eq"):
        if role == "numref" and not target:
            return "the figure" if content.strip().startswith("fig-") else "(see the book)"
        if role == "doc" and not target:
            return f"*{Path(content).name.replace('_', ' ')}*"
        return label or content
    return f"`{label or content}`"


def myst_to_markdown(text: str) -> str:
    """Rewrite the MyST parts of a Markdown cell into plain Markdown."""
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
        elif name in _LEFT_OUT:
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


def drop_code(text: str) -> str:
    """Leave fenced code blocks out, also inside directives (whose fences stay): speaker notes
    are the prose, the code is in the notebook."""
    out: list[str] = []
    stack: list[tuple[str, bool]] = []  # the open fences, innermost last: (marker, is code)
    for line in text.splitlines():
        match = _ANY_FENCE.match(line)
        in_code = any(code for _, code in stack)
        if match:
            marker, info = match.group(1), match.group(2).strip()
            if stack and marker.startswith(stack[-1][0]) and not info:  # closes the innermost
                code = stack.pop()[1]
                if not code and not in_code:
                    out.append(line)
                continue
            if not in_code:  # a fence inside code is code
                code = not info.startswith("{") and not marker.startswith(":")
                stack.append((marker, code))
                if not code:
                    out.append(line)
                continue
        if not in_code:
            out.append(line)
    return "\n".join(out)


# --- rendering -------------------------------------------------------------------------------


@functools.cache
def _markdown() -> MarkdownIt:
    def math(content: str, options: dict) -> str:  # left as $-TeX, for MathJax or the speaker
        delimiter = "$$" if options.get("display_mode") else "$"
        return f"{delimiter}{html.escape(content)}{delimiter}"

    return (
        MarkdownIt("commonmark")
        .enable("table")
        .use(dollarmath_plugin, double_inline=True, renderer=math)
    )


def inline_html(text: str) -> Markup:
    """A headline, bullet or caption: inline Markdown and $-math."""
    return Markup(_markdown().renderInline(myst_to_markdown(text)))


def notes_html(markdown: str) -> Markup:
    # Twice: code inside directives first, then the fences that MyST's code directives become.
    return Markup(_markdown().render(drop_code(myst_to_markdown(drop_code(markdown)))))


def deck_slides(outline: so.Outline, handles: so.Handles, figure_dir: str) -> list[dict]:
    """The template's view of each slide, title first (``figure_dir``: the images' URL prefix)."""
    assert handles.title is not None, "check_handles first"
    slides = [
        {
            "title": True,
            "headline": inline_html(handles.title.lstrip("# ")),
            "subtitle": inline_html(outline.subtitle) if outline.subtitle else None,
            "source": f"Chapter notebook: {outline.notebook}.ipynb",
            "notes": notes_html("\n\n".join(handles.prose[handles.title])),
        }
    ]
    for slide in outline.slides:
        slides.append(
            {
                "headline": inline_html(slide.headline),
                "bullets": [inline_html(b) for b in slide.bullets],
                "figure": slide.figure,
                "image": f"{figure_dir}/{slide.figure}.png" if slide.figure else None,
                "caption": inline_html(slide.caption) if slide.caption else None,
                "notes": notes_html(so.notes_markdown(slide, handles)),
            }
        )
    return slides


def render_deck(slides: list[dict], title: str) -> str:
    """The deck's HTML (the slides' rendered Markdown is Markup; everything else is escaped)."""
    import jinja2

    env = jinja2.Environment(autoescape=True, keep_trailing_newline=True)
    template = env.from_string(TEMPLATE.read_text(encoding="utf-8"))
    return template.render(slides=slides, title_text=title)


# --- export ----------------------------------------------------------------------------------


def export_deck(nb_path: Path, out_dir: Path, outlines: Path = OUTLINES) -> Path:
    """Write ``out_dir/<stem>.slides.html`` and its figures; raises OutlineError."""
    outline = so.load_outline(so.outline_path(outlines, nb_path.stem))
    if outline.notebook != nb_path.stem:
        raise so.OutlineError(f"{outline.path} is for {outline.notebook}, not {nb_path.stem}")
    handles = so.index_notebook(nbformat.read(nb_path, as_version=4))
    so.check_handles(outline, handles, images=True)
    figure_dir = f"figures/{nb_path.stem}"
    shutil.rmtree(out_dir / figure_dir, ignore_errors=True)  # no stale images
    (out_dir / figure_dir).mkdir(parents=True)
    for slide in outline.slides:
        if slide.figure:
            png = base64.b64decode(so.image_png(handles.figures[slide.figure]) or "")
            (out_dir / figure_dir / f"{slide.figure}.png").write_bytes(png)
    slides = deck_slides(outline, handles, figure_dir)
    target = out_dir / f"{nb_path.stem}.slides.html"
    target.write_text(render_deck(slides, str(handles.title).lstrip("# ")), encoding="utf-8")
    return target


def check_outlines(notebook_dir: Path, outlines: Path = OUTLINES) -> list[so.Outline]:
    """Load every chapter's outline and resolve it against the notebooks (no images needed)."""
    checked = []
    for nb_path in sorted(notebook_dir.glob("[0-9][0-9]_*.ipynb")):
        path = so.outline_path(outlines, nb_path.stem)
        if not path.is_file():
            raise so.OutlineError(f"no slide outline for {nb_path.name}: write {path}")
        outline = so.load_outline(path)
        handles = so.index_notebook(nbformat.read(nb_path, as_version=4))
        so.check_handles(outline, handles, images=False)
        checked.append(outline)
    return checked


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
        "<body><h1>Slides</h1>\n<p>One reveal.js workshop deck per chapter. Arrow keys move "
        "between slides, <kbd>s</kbd> opens the speaker view with the chapter's prose as "
        "notes.</p>\n"
        f"<ul>\n{items}\n</ul></body></html>\n",
        encoding="utf-8",
    )
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="write the decks")
    p_build.add_argument("src", type=Path)
    p_build.add_argument("out", type=Path)
    p_build.add_argument("--vendor", type=Path, default=ROOT / "book" / "_vendor")
    p_build.add_argument("--outlines", type=Path, default=OUTLINES)
    p_check = sub.add_parser("check", help="resolve every outline against the notebooks")
    p_check.add_argument("src", type=Path, nargs="?", default=ROOT / "book" / "chapters")
    p_check.add_argument("--outlines", type=Path, default=OUTLINES)
    args = parser.parse_args(argv)

    try:
        if args.command == "check":
            checked = check_outlines(args.src, args.outlines)
            print(f"slides: {len(checked)} outlines resolve against {args.src}")
            return 0
        notebooks = sorted(args.src.glob("[0-9][0-9]_*.ipynb"))
        if not notebooks:
            raise SystemExit(f"slides: no chapter notebooks in {args.src}")
        args.out.mkdir(parents=True, exist_ok=True)
        decks = [export_deck(path, args.out, args.outlines) for path in notebooks]
        copy_vendor(args.vendor, args.out)
    except so.OutlineError as exc:
        raise SystemExit(f"slides: {exc}") from None
    index = write_index(decks, args.out)
    print(f"slides: {len(decks)} decks in {args.out} (open {index})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
