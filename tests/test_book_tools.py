"""The book's build tools: staging, slides, and the two local Sphinx extensions (no build needed)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


stage_book = load(ROOT / "scripts" / "stage_book.py")
slides = load(ROOT / "scripts" / "slides.py")
chapter_numbers = load(ROOT / "book" / "_ext" / "chapter_numbers.py")
offline_pages = load(ROOT / "book" / "_ext" / "offline_pages.py")


# --- staging ----------------------------------------------------------------------------------


def test_stage_copies_sources_and_switches_execution_off(tmp_path):
    src = tmp_path / "book"
    (src / "chapters").mkdir(parents=True)
    (src / "_build" / "html").mkdir(parents=True)
    (src / "_vendor" / "mathjax").mkdir(parents=True)
    (src / "_config.yml").write_text("execute:\n  execute_notebooks: force\n  timeout: 600\n")
    nbformat.write(nbformat.v4.new_notebook(), src / "chapters" / "01_x.ipynb")
    (src / "_build" / "html" / "old.html").write_text("stale")

    dest = stage_book.stage(src, tmp_path / "staged")
    assert (dest / "chapters" / "01_x.ipynb").is_file()
    assert not (dest / "_build").exists(), "build outputs must not be copied"
    assert (dest / "_vendor").is_symlink() and (dest / "_vendor" / "mathjax").is_dir()
    config = (dest / "_config.yml").read_text()
    assert 'execute_notebooks: "off"' in config and "timeout: 600" in config
    assert "force" in (src / "_config.yml").read_text(), "the source config is untouched"

    (dest / "chapters" / "stale.ipynb").write_text("{}")
    stage_book.stage(src, dest)  # staging again starts from a clean copy
    assert not (dest / "chapters" / "stale.ipynb").exists()


def test_stage_refuses_a_config_without_the_execution_switch(tmp_path):
    src = tmp_path / "book"
    src.mkdir()
    (src / "_config.yml").write_text("title: x\n")
    with pytest.raises(SystemExit, match="execute_notebooks"):
        stage_book.stage(src, tmp_path / "staged")


def test_stage_refuses_to_delete_its_sources(tmp_path):
    src = tmp_path / "book"
    (src / "chapters").mkdir(parents=True)
    (src / "_config.yml").write_text("execute_notebooks: force\n")
    for dest in (src, tmp_path):
        with pytest.raises(SystemExit, match="delete the sources"):
            stage_book.stage(src, dest)
    with pytest.raises(SystemExit, match="no _config.yml"):
        stage_book.stage(src / "chapters", tmp_path / "x")
    assert (src / "_config.yml").is_file()


def test_the_real_book_config_can_be_staged():
    text = (ROOT / "book" / "_config.yml").read_text()
    assert len(stage_book._EXECUTE.findall(text)) == 1


# --- slides -----------------------------------------------------------------------------------


def test_myst_roles_become_plain_markdown():
    text = (
        "See {cite}`micikevicius2022fp8` and {numref}`fig-ch4-histograms`, "
        "{doc}`chapter 2 <02_measuring_honestly>`, {term}`MFU` and {term}`the ridge <ridge point>`."
    )
    text += (
        " Back to [chapter 3](03_bf16_mixed_precision.ipynb#formats), see [TE](https://x.ipynb)."
    )
    out = slides.myst_to_markdown(text)
    assert "{" not in out
    assert "Back to chapter 3, see [TE](https://x.ipynb)." in out
    assert "[micikevicius2022fp8]" in out
    assert "chapter 2" in out and "MFU" in out and "the ridge" in out
    assert "and the figure," in out, "a figure's number means nothing next to a slide"


def test_myst_directives_become_quotes_and_includes_vanish():
    text = "\n".join(
        [
            "Before.",
            "```{admonition} Takeaway",
            ":class: tip",
            "FP8 needs a {term}`scaling factor`.",
            "```",
            "```{include} ../exercises/ch04.md",
            "```",
            "After.",
        ]
    )
    out = slides.myst_to_markdown(text)
    assert out.splitlines() == [
        "Before.",
        "> **Takeaway**",
        ">",
        "> FP8 needs a scaling factor.",
        "After.",
    ]


# A tiny executed chapter and an outline of it, for the build tests.
PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


def tiny_chapter(folder: Path, *, image: bool = True) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 9. A chapter\n\nWhat you learn, with $x^2$."),
        nbformat.v4.new_code_cell("import tutorial_lib"),
        nbformat.v4.new_markdown_cell(
            "## 9.1 First\n\nProse one, see {cite}`arfeen2025ntp` and {numref}`fig-x`.\n\n"
            "```python\n# not a heading\nsecret_code = 1\n```\n\n"
            "```{admonition} Takeaway\n:class: tip\nBoxed $y$.\n```\n\n"
            ":::{dropdown} A worked solution\n```python\nsolution_code = 2\n```\n:::"
        ),
        nbformat.v4.new_code_cell("plot()"),
        nbformat.v4.new_markdown_cell("More prose of 9.1.\n\n### A detail\n\nDetail prose."),
        nbformat.v4.new_markdown_cell("## Exercises\n\n```{include} ../exercises/ch09.md\n```"),
    ]
    nb.cells[3].metadata["mystnb"] = {"figure": {"caption": "A $y$ caption.", "name": "fig-x"}}
    if image:
        nb.cells[3].outputs = [
            nbformat.v4.new_output("display_data", data={"image/png": PNG_1PX, "text/plain": "F"})
        ]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / "09_x.ipynb")
    return folder / "09_x.ipynb"


def tiny_outline(folder: Path, slides_: list[dict] | None = None, **extra) -> Path:
    if slides_ is None:
        slides_ = [
            {"headline": "The first idea", "bullets": ["One $a^2$", "Two `code`"]},
            {"headline": "The plot", "figure": "fig-x", "caption": "Notice *this*"},
        ] + [{"headline": f"Point {i}", "bullets": ["A bullet"]} for i in range(8)]
        for s in slides_:
            if "figure" not in s:
                s["notes"] = "## 9.1 First"
        slides_[-1]["notes"] = ["## 9.1 First", "### A detail"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ch09.yml"
    path.write_text(yaml.safe_dump({"notebook": "09_x", "slides": slides_, **extra}))
    return path


def test_an_outline_loads_with_its_defaults(tmp_path):
    outline = slides.so.load_outline(tiny_outline(tmp_path, subtitle="Sub"))
    assert outline.notebook == "09_x" and outline.subtitle == "Sub" and len(outline.slides) == 10
    first, plot = outline.slides[:2]
    assert first.bullets == ("One $a^2$", "Two `code`") and first.notes == ("## 9.1 First",)
    assert plot.figure == "fig-x" and plot.caption == "Notice *this*" and plot.notes == ()
    assert slides.so.count_words("Ratio $9h/((t-1)$ of *FP8* `code`") == 5


@pytest.mark.parametrize(
    "change, message",
    [
        ({"bullets": ["b"] * 5}, "5 bullets, at most 4"),
        ({"bullets": ["word " * 17]}, "more than 16 words"),
        ({"bullets": ["w " * 13] * 4, "headline": "ten " * 10}, "62 visible words, at most 60"),
        ({"headline": "word " * 13}, "headline has more than 12"),
        ({"figure": "fig-x"}, "one figure or bullets, not both"),
        ({"notes": []}, "no speaker notes"),
        ({"colour": "red"}, "unknown keys"),
    ],
)
def test_the_build_refuses_a_slide_over_the_budget(tmp_path, change, message):
    path = tiny_outline(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["slides"][2].update(change)
    path.write_text(yaml.safe_dump(data))
    tiny_chapter(tmp_path / "src")
    with pytest.raises(SystemExit, match=rf"chapter 9 \(ch09.yml\), slide 4 .*{message}"):
        slides.main(
            [
                "build",
                str(tmp_path / "src"),
                str(tmp_path / "out"),
                "--outlines",
                str(tmp_path),
                "--vendor",
                str(tmp_path / "no-vendor-needed"),
            ]
        )


@pytest.mark.parametrize("count", [8, 25])
def test_a_deck_has_10_to_25_slides(tmp_path, count):
    path = tiny_outline(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["slides"] = (data["slides"] * 3)[:count]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(slides.so.OutlineError, match=rf"chapter 9 .*{count + 1} slides"):
        slides.so.load_outline(path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"notes": "## 9.1 Frist"}, "no heading '## 9.1 Frist' .*did you mean '## 9.1 First'"),
        ({"notes": "# not a heading"}, "no heading '# not a heading'"),
        ({"bullets": [], "figure": "fig-y"}, "no figure 'fig-y' .*did you mean 'fig-x'"),
    ],
)
def test_a_missing_handle_names_chapter_slide_and_handle(tmp_path, change, message):
    path = tiny_outline(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["slides"][0].update(change)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(slides.so.OutlineError, match=rf"chapter 9 .*slide 2 .*{message}"):
        slides.check_outlines(tiny_chapter(tmp_path / "src").parent, tmp_path)


def test_a_figure_without_its_image_stops_the_build(tmp_path):
    src = tiny_chapter(tmp_path / "src", image=False)
    tiny_outline(tmp_path)
    slides.check_outlines(src.parent, tmp_path)  # the committed notebooks have no outputs: fine
    with pytest.raises(slides.so.OutlineError, match="slide 3 .*'fig-x' has no image output"):
        slides.export_deck(src, tmp_path / "out", tmp_path)


def test_a_deck_has_notes_on_every_slide_and_loads_nothing_from_outside(tmp_path):
    tiny_outline(tmp_path, subtitle="A $z$ subtitle")
    deck = slides.export_deck(tiny_chapter(tmp_path / "src"), tmp_path / "out", tmp_path)
    page = deck.read_text()
    sections = re.findall(r"<section.*?</section>", page, re.S)
    assert len(sections) == 11, "the title slide and the outline's ten"
    notes = [re.search(r'<aside class="notes[^"]*">(.*?)</aside>', s, re.S) for s in sections]
    assert all(n and n.group(1).strip() for n in notes), "every slide has speaker notes"
    assert "<h1>9. A chapter</h1>" in sections[0] and "What you learn" in notes[0].group(1)
    assert '<li>One <span class="math inline">$a^2$</span></li>' in sections[1]
    first = notes[1].group(1)
    assert "Prose one" in first and "[arfeen2025ntp]" in first and "the figure" in first
    assert "More prose of 9.1." in first and "Detail prose" not in first, "up to the next heading"
    assert "secret_code" not in first and "Boxed" in first, "code left out, takeaways kept"
    assert "solution_code" not in first and "A worked solution" in first
    figure_notes = re.sub(r"<[^>]+>", "", notes[2].group(1)).strip()
    assert figure_notes == "Figure. A $y$ caption.", "the book's caption opens the figure's notes"
    assert "Detail prose" in notes[-1].group(1)
    assert "{" not in re.sub(r"\$[^$]*\$", "", page.split("<body>")[1].split("<script")[0])
    loaded = re.findall(r'<(?:script|link|img)[^>]*?(?:src|href)="([^"]+)"', page)
    assert loaded and all(u.startswith(("_vendor/", "figures/", "data:")) for u in loaded), loaded
    image = tmp_path / "out" / "figures" / "09_x" / "fig-x.png"
    assert image.read_bytes().startswith(b"\x89PNG") and 'src="figures/09_x/fig-x.png"' in page


def test_headings_in_code_are_not_handles():
    cells = [
        nbformat.v4.new_markdown_cell("# 1. T\n\nIntro"),
        nbformat.v4.new_markdown_cell(
            "````{admonition} X\n```python\n# comment\n```\n## inside\n````"
        ),
        nbformat.v4.new_markdown_cell("## 1.1 Real  \nText"),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    handles = slides.so.index_notebook(nb)
    assert handles.title == "# 1. T" and list(handles.prose) == ["# 1. T", "## 1.1 Real"]


def numbered_sections(headings: list[str]) -> set[str]:
    """The numbered ``## N.M`` sections and the ``###`` subsections under them (unnumbered
    sections, such as the summary, the exercises or a recorded-results note, are optional)."""
    found, numbered = set(), False
    for heading in headings:
        if heading.startswith("## "):
            numbered = re.match(r"## \d+\.\d+ ", heading) is not None
        if numbered and heading.startswith(("## ", "### ")):
            found.add(heading)
    return found


def test_every_outline_resolves_and_covers_its_chapter():
    """Every committed chapter has an outline whose headings and figures exist in the notebook
    (figures as cells: the committed notebooks have no outputs), and the prose of every numbered
    section is in some slide's notes, so the decks cannot drift from the notebooks."""
    chapters = sorted((ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb"))
    outlines = slides.check_outlines(ROOT / "book" / "chapters")
    assert [o.notebook for o in outlines] == [p.stem for p in chapters]
    for outline, path in zip(outlines, chapters, strict=True):
        handles = slides.so.index_notebook(nbformat.read(path, as_version=4))
        used = {slides.so.normalise(h) for s in outline.slides for h in s.notes}
        sections = numbered_sections(list(handles.prose))
        assert len(sections) >= 5, f"{outline.chapter}: sections not found"
        assert sections <= used, f"{outline.chapter}: no slide's notes cover {sections - used}"
        assert any(s.figure for s in outline.slides), f"{outline.chapter}: no figure"


# --- Sphinx extensions ------------------------------------------------------------------------


def test_chapter_numbers_restart_in_every_chapter():
    env = SimpleNamespace(
        toc_fignumbers={
            "chapters/04_fp8_formats": {
                "exercise": {"ch4-ex2": (12,), "ch4-ex1": (11,)},
                "figure": {"fig-a": (7,)},
            },
            "chapters/10_more": {"exercise": {"ch10-ex1": (30,)}},
            "workshop/agenda": {"table": {"t1": (3,)}},
        }
    )
    assert chapter_numbers.renumber(None, env) == []
    numbers = env.toc_fignumbers
    assert numbers["chapters/04_fp8_formats"]["exercise"] == {"ch4-ex1": (4, 1), "ch4-ex2": (4, 2)}
    assert numbers["chapters/04_fp8_formats"]["figure"] == {"fig-a": (4, 1)}
    assert numbers["chapters/10_more"]["exercise"] == {"ch10-ex1": (10, 1)}
    assert numbers["workshop/agenda"]["table"] == {"t1": (3,)}, "other pages keep Sphinx's numbers"


def test_thebe_assets_are_dropped_and_others_kept():
    class Asset(str):
        def __new__(cls, filename, body=None):
            obj = super().__new__(cls, filename or "")
            obj.filename, obj.attributes = filename, {"body": body} if body else {}
            return obj

    keep = [Asset("_static/doctools.js"), Asset(None, body="window.MathJax = {}")]
    drop = [
        Asset("_static/sphinx-thebe.js"),
        Asset(None, body='const THEBE_JS_URL = "https://unpkg.com/thebe"'),
    ]
    context = {"script_files": keep + drop, "css_files": [Asset("_static/sphinx-thebe.css")]}
    offline_pages.drop_thebe(None, "p", "page.html", context, None)
    assert context["script_files"] == keep and context["css_files"] == []


def test_widget_scripts_exist_and_target_the_vendored_manager():
    paths = offline_pages.REQUIREJS_PATHS.read_text()
    assert "@jupyter-widgets/html-manager/dist" in paths and "_static/" in paths
    assert "MathJax.Hub" in offline_pages.MATHJAX2_SHIM.read_text()
