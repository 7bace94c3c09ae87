"""A chapter's slide outline: a YAML file whose slides point into the chapter's notebook.

``book/_slides/outline/chNN.yml`` describes the workshop deck of chapter NN::

    notebook: 05_delayed_scaling            # book/chapters/<notebook>.ipynb
    subtitle: Scale FP8 with the amax of earlier steps    # optional, on the title slide
    slides:
      - headline: One amax history per tensor
        bullets:                            # at most 4 short bullets ...
          - Quantize with the scale of earlier steps
        notes: "## 5.1 The algorithm"       # heading(s) whose prose becomes the speaker notes
      - headline: Scales follow amax down
        figure: fig-ch5-scaling-state       # ... or one figure, by its name in the notebook
        caption: The gradient's scale is huge  # optional, one short line under the figure
        notes: "## 5.2 Amax and scale during real training"

The deck opens with a title slide: the notebook's ``# `` heading, the subtitle, and the prose
under that heading as its notes. Headlines, bullets and captions are the outline's own words;
everything else comes from the notebook through two kinds of stable handle, never cell indices:

- a **heading**, written as in the notebook (``"## 5.1 The algorithm"``, ``"### Parameters"``):
  its prose is the Markdown after that heading line up to the next heading of any level, across
  cells, code cells left out (a ``##`` section's subsections are handles of their own);
- a **figure name**, the ``mystnb.figure.name`` of a code cell (the metadata that gives the book
  its numbered, captioned figures). The slide shows that cell's image output from the executed
  notebook, and the figure's caption opens the slide's notes.

The budget, checked when an outline is loaded (the build refuses to go over it) and again in the
browser test on what the deck shows: 10 to 25 slides per deck, title included; per slide a
headline of at most 12 words and either one figure or at most 4 bullets of at most 16 words,
60 visible words in all (a ``$...$`` formula counts as one word). Every slide has speaker notes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml

MIN_SLIDES, MAX_SLIDES = 10, 25  # per deck, the title slide included
MAX_BULLETS = 4
MAX_WORDS = 60  # visible words on one slide: headline, bullets and caption
MAX_HEADLINE_WORDS = 12
MAX_BULLET_WORDS = 16  # also for a figure's caption
SLIDE_KEYS = {"headline", "bullets", "figure", "caption", "notes"}
OUTLINE_KEYS = {"notebook", "subtitle", "slides"}

_HEADING = re.compile(r"^(#{1,6})\s+(\S.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})")
_MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+\$")


class OutlineError(ValueError):
    """An outline that cannot be built; the message names the chapter and the slide."""


@dataclass(frozen=True)
class Slide:
    headline: str
    bullets: tuple[str, ...] = ()
    figure: str | None = None  # a code cell's mystnb.figure.name
    caption: str | None = None
    notes: tuple[str, ...] = ()  # heading handles, e.g. "## 5.1 The algorithm"


@dataclass(frozen=True)
class Outline:
    path: Path
    notebook: str  # the notebook's stem, e.g. "05_delayed_scaling"
    subtitle: str | None
    slides: tuple[Slide, ...]

    @property
    def chapter(self) -> str:
        return f"chapter {int(self.notebook[:2])} ({self.path.name})"

    def where(self, index: int) -> str:
        """How a message names outline slide ``index``: its number in the deck (the title slide
        is 1) and its headline."""
        return f"{self.chapter}, slide {index + 2} ({self.slides[index].headline!r})"


def count_words(text: str) -> int:
    """Visible words of a headline, bullet or caption; a formula counts as one."""
    text = _MATH.sub(" M ", text)
    return len(re.sub(r"[*_`]", "", text).split())


# --- loading and the budget ------------------------------------------------------------------


def outline_path(outline_dir: Path, notebook_stem: str) -> Path:
    return outline_dir / f"ch{notebook_stem[:2]}.yml"


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise OutlineError(f"{what} must be a non-empty string, not {value!r}")
    return value.strip()


def _slide(raw: object, where: str) -> Slide:
    if not isinstance(raw, dict):
        raise OutlineError(f"{where}: a slide is a mapping with a headline, not {raw!r}")
    headline = _text(raw.get("headline"), f"{where}: headline")
    where = f"{where} ({headline!r})"
    unknown = set(raw) - SLIDE_KEYS
    if unknown:
        raise OutlineError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(SLIDE_KEYS)})")
    bullets = raw.get("bullets") or []
    notes = raw.get("notes") or []
    if isinstance(notes, str):
        notes = [notes]
    if not isinstance(bullets, list) or not isinstance(notes, list):
        raise OutlineError(f"{where}: bullets and notes are lists of strings")
    return Slide(
        headline=headline,
        bullets=tuple(_text(b, f"{where}: a bullet") for b in bullets),
        figure=_text(raw["figure"], f"{where}: figure") if "figure" in raw else None,
        caption=_text(raw["caption"], f"{where}: caption") if "caption" in raw else None,
        notes=tuple(_text(n, f"{where}: a notes heading") for n in notes),
    )


def load_outline(path: Path) -> Outline:
    """Read and check one outline file (its budget included); raises OutlineError."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise OutlineError(f"cannot read the slide outline {path}: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("slides"), list):
        raise OutlineError(f"{path}: an outline is a mapping with `notebook` and a `slides` list")
    unknown = set(raw) - OUTLINE_KEYS
    if unknown:
        raise OutlineError(
            f"{path}: unknown keys {sorted(unknown)} (known: {sorted(OUTLINE_KEYS)})"
        )
    notebook = _text(raw.get("notebook"), f"{path}: notebook")
    if not re.match(r"^\d\d_", notebook) or path.stem != f"ch{notebook[:2]}":
        raise OutlineError(
            f"{path}: outline chNN.yml must name a notebook NN_..., not {notebook!r}"
        )
    chapter = f"chapter {int(notebook[:2])} ({path.name})"
    slides = tuple(_slide(s, f"{chapter}, slide {i + 2}") for i, s in enumerate(raw["slides"]))
    subtitle = raw.get("subtitle")
    outline = Outline(
        path, notebook, _text(subtitle, f"{path}: subtitle") if subtitle else None, slides
    )
    check_budget(outline)
    return outline


def check_budget(outline: Outline) -> None:
    """Raise OutlineError for the first slide (or deck) over the budget in the module docstring."""
    total = len(outline.slides) + 1
    if not MIN_SLIDES <= total <= MAX_SLIDES:
        raise OutlineError(
            f"{outline.chapter}: {total} slides (the title included); a deck has "
            f"{MIN_SLIDES} to {MAX_SLIDES}"
        )
    for i, slide in enumerate(outline.slides):
        where = outline.where(i)
        if slide.figure and slide.bullets:
            raise OutlineError(f"{where}: a slide shows one figure or bullets, not both")
        if slide.caption and not slide.figure:
            raise OutlineError(f"{where}: a caption needs a figure")
        if len(slide.bullets) > MAX_BULLETS:
            raise OutlineError(
                f"{where}: {len(slide.bullets)} bullets, at most {MAX_BULLETS}; move the rest "
                "into the speaker notes or onto another slide"
            )
        if count_words(slide.headline) > MAX_HEADLINE_WORDS:
            raise OutlineError(f"{where}: the headline has more than {MAX_HEADLINE_WORDS} words")
        for line in (*slide.bullets, *([slide.caption] if slide.caption else [])):
            if count_words(line) > MAX_BULLET_WORDS:
                raise OutlineError(f"{where}: {line!r} has more than {MAX_BULLET_WORDS} words")
        words = sum(map(count_words, (slide.headline, *slide.bullets, slide.caption or "")))
        if words > MAX_WORDS:
            raise OutlineError(f"{where}: {words} visible words, at most {MAX_WORDS}")
        if not slide.notes and not slide.figure:
            raise OutlineError(
                f"{where}: no speaker notes; name the heading(s) whose prose they are (notes:)"
            )


# --- handles in a notebook -------------------------------------------------------------------


@dataclass
class Handles:
    """What an outline can point at in one notebook."""

    title: str | None = None  # the first "# " heading, as written
    prose: dict[str, list[str]] = field(default_factory=dict)  # heading -> Markdown under it
    figures: dict[str, nbformat.NotebookNode] = field(default_factory=dict)  # name -> code cell


def normalise(heading: str) -> str:
    match = _HEADING.match(heading.strip())
    return f"{match.group(1)} {match.group(2)}" if match else " ".join(heading.split())


def index_notebook(nb: nbformat.NotebookNode) -> Handles:
    """The headings (with their prose) and named figures of a notebook. Lines inside fenced
    blocks (code, directives) are never headings."""
    handles = Handles()
    current: list[str] | None = None
    for cell in nb.cells:
        if cell.cell_type == "code":
            name = cell.metadata.get("mystnb", {}).get("figure", {}).get("name")
            if name:
                handles.figures[name] = cell
            continue
        if cell.cell_type != "markdown":
            continue
        fence: str | None = None
        chunk: list[str] = []
        for line in cell.source.splitlines():
            match = _FENCE.match(line)
            if match and (fence is None or match.group(1).startswith(fence)):
                fence = match.group(1) if fence is None else None
            heading = _HEADING.match(line) if fence is None else None
            if heading:
                if current is not None:
                    current.append("\n".join(chunk))
                chunk = []
                key = normalise(line)
                current = handles.prose.setdefault(key, [])
                if handles.title is None and len(heading.group(1)) == 1:
                    handles.title = key
                continue
            chunk.append(line)
        if current is not None:
            current.append("\n".join(chunk))
    for key, chunks in handles.prose.items():
        handles.prose[key] = [c.strip("\n") for c in chunks if c.strip()]
    return handles


def image_png(cell: nbformat.NotebookNode) -> str | None:
    """The last PNG (base64) among a code cell's outputs, or None."""
    images = [
        o["data"]["image/png"]
        for o in cell.get("outputs", [])
        if "data" in o and "image/png" in o["data"]
    ]
    return images[-1] if images else None


def _unknown(kind: str, handle: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(handle, known, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else f"; the notebook has {known}"
    return f"no {kind} {handle!r} in the notebook{hint}"


def check_handles(outline: Outline, handles: Handles, *, images: bool) -> None:
    """Raise OutlineError unless every heading and figure the outline names exists (and, with
    ``images``, every figure cell has an image output, as in an executed notebook)."""
    if handles.title is None:
        raise OutlineError(f"{outline.chapter}: {outline.notebook} has no '# ' title heading")
    for i, slide in enumerate(outline.slides):
        for heading in slide.notes:
            if normalise(heading) not in handles.prose:
                raise OutlineError(
                    f"{outline.where(i)}: " + _unknown("heading", heading, list(handles.prose))
                )
        if slide.figure is None:
            continue
        cell = handles.figures.get(slide.figure)
        if cell is None:
            raise OutlineError(
                f"{outline.where(i)}: " + _unknown("figure", slide.figure, list(handles.figures))
            )
        if images and image_png(cell) is None:
            raise OutlineError(
                f"{outline.where(i)}: figure {slide.figure!r} has no image output in "
                f"{outline.notebook}.ipynb; build the slides from executed notebooks "
                "(make slides)"
            )


def notes_markdown(slide: Slide, handles: Handles) -> str:
    """The speaker notes of a slide, as MyST Markdown: the figure's caption, then the prose
    under each heading the slide names."""
    parts: list[str] = []
    if slide.figure:
        caption = handles.figures[slide.figure].metadata["mystnb"]["figure"].get("caption")
        if caption:
            parts.append(f"*Figure.* {caption.strip()}")
    for heading in slide.notes:
        parts.extend(handles.prose[normalise(heading)])
    return "\n\n".join(parts)
