"""The book's build tools: staging, slides, and the two local Sphinx extensions (no build needed)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import nbformat
import pytest

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


def test_tagging_fills_missing_types_and_keeps_chosen_ones():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 4. FP8"),
        nbformat.v4.new_markdown_cell("Some prose."),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("## 4.1 Formats"),
        nbformat.v4.new_markdown_cell("### A detail"),
        nbformat.v4.new_markdown_cell("Chosen by hand."),
        nbformat.v4.new_markdown_cell("## Exercises\n\n```{include} ../exercises/ch04.md\n```"),
    ]
    nb.cells[5].metadata["slideshow"] = {"slide_type": "notes"}
    assert slides.missing_types(nb) == [0, 1, 2, 3, 4, 6]
    assert slides.tag(nb) == 6
    types = [c.metadata["slideshow"]["slide_type"] for c in nb.cells]
    assert types == ["slide", "-", "subslide", "slide", "subslide", "notes", "skip"]
    assert slides.missing_types(nb) == [] and slides.tag(nb) == 0


def test_every_chapter_is_tagged_for_slides():
    for path in sorted((ROOT / "book" / "chapters").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        assert slides.missing_types(nb) == [], f"{path.name}: run scripts/slides.py tag"
        assert nb.cells[0].metadata["slideshow"]["slide_type"] == "slide"


def test_a_deck_loads_nothing_from_outside(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 9. A chapter\n\nMath: $x^2$ and {cite}`arfeen2025ntp`."),
        nbformat.v4.new_code_cell("print(1)"),
    ]
    nb.cells[1].metadata["mystnb"] = {"figure": {"caption": "A $y$ caption.", "name": "fig-x"}}
    src = tmp_path / "src"
    src.mkdir()
    nbformat.write(nb, src / "09_x.ipynb")
    deck = slides.export_deck(src / "09_x.ipynb", tmp_path)
    page = deck.read_text()
    loaded = re.findall(r'<(?:script|link|img)[^>]*?(?:src|href)="([^"]+)"', page)
    assert loaded, "the deck loads its scripts from files"
    assert all(url.startswith("_vendor/") for url in loaded), loaded
    assert "[arfeen2025ntp]" in page
    assert "A $y$ caption." in page, "the figure caption appears under its plot"
    assert "MathJax.Hub" in page  # the widget renderer's MathJax 2 call is bridged


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
