"""Static checks of the Jupyter Book configuration: fast, and no build needed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

BOOK = Path(__file__).resolve().parents[1] / "book"
URL = re.compile(r"https?://|^//", re.IGNORECASE)
BIB_ENTRY = re.compile(r"@(\w+)\s*\{\s*([^,\s]+)\s*,", re.MULTILINE)


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((BOOK / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{name} must be a YAML mapping"
    return data


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return load("_config.yml")


@pytest.fixture(scope="module")
def sphinx_config(config: dict[str, Any]) -> dict[str, Any]:
    return config["sphinx"]["config"]


def toc_files(node: Any) -> list[str]:
    """Every `file:` (and the root) named anywhere in the toc."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("file", "root") and isinstance(value, str):
                found.append(value)
            else:
                found.extend(toc_files(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(toc_files(item))
    return found


def test_toc_entries_exist() -> None:
    toc = load("_toc.yml")
    assert toc["format"] == "jb-book"
    files = toc_files(toc)
    assert files[0] == toc["root"] == "intro"
    for name in files:
        candidates = [BOOK / f"{name}{ext}" for ext in ("", ".md", ".ipynb", ".rst")]
        assert any(p.is_file() for p in candidates), f"toc entry {name!r} has no file in book/"


def test_execution_fails_on_cell_errors(config: dict[str, Any]) -> None:
    execute = config["execute"]
    assert execute["execute_notebooks"] == "force"
    assert execute["allow_errors"] is False
    assert execute["raise_on_error"] is True


def test_js_is_vendored_not_from_a_cdn(sphinx_config: dict[str, Any]) -> None:
    mathjax = sphinx_config["mathjax_path"]
    assert not URL.search(mathjax), f"mathjax_path must be a local path, got {mathjax!r}"
    widgets_js = sphinx_config["nb_ipywidgets_js"]
    assert widgets_js, "nb_ipywidgets_js must be set, or myst-nb falls back to CDN URLs"
    for path, attributes in widgets_js.items():
        assert not URL.search(path), f"nb_ipywidgets_js entry {path!r} is a URL"
        for value in (attributes or {}).values():
            assert not URL.search(str(value)), f"{path}: attribute value {value!r} is a URL"
    assert any(p.endswith("require.js") for p in widgets_js)
    assert any(p.endswith("embed-amd.js") for p in widgets_js)
    assert "_vendor" in sphinx_config["html_static_path"]
    for folder in sphinx_config["html_static_path"]:
        assert folder == "_vendor" or (BOOK / folder).is_dir(), f"static path {folder} is missing"
    for js in sphinx_config.get("html_js_files", []):
        assert not URL.search(js), f"html_js_files entry {js!r} is a URL"


def test_no_book_static_folder() -> None:
    # Jupyter Book 1 adds every .js under every html_static_path to every page once book/_static
    # exists: that would be all of the vendored MathJax.
    assert not (BOOK / "_static").exists(), "book/_static would pull all vendored JS into each page"


def test_launch_buttons(config: dict[str, Any]) -> None:
    buttons = config["launch_buttons"]
    assert buttons["colab_url"].startswith("https://colab.research.google.com")
    assert buttons["binderhub_url"].startswith("https://mybinder.org")
    repo = config["repository"]
    assert repo["url"].startswith("https://github.com/")
    assert repo["path_to_book"] == "book"
    assert repo["branch"]


def split_entries(text: str) -> list[tuple[str, str, str]]:
    """(type, key, body) of each @type{key, ...} entry, matching braces to find the body's end."""
    entries = []
    for match in BIB_ENTRY.finditer(text):
        depth, pos = 1, match.end()
        while depth and pos < len(text):
            depth += {"{": 1, "}": -1}.get(text[pos], 0)
            pos += 1
        assert depth == 0, f"unbalanced braces in bib entry {match.group(2)!r}"
        entries.append((match.group(1).lower(), match.group(2), text[match.end() : pos - 1]))
    return entries


def test_bibliography_entries(config: dict[str, Any]) -> None:
    bibfiles = config["bibtex_bibfiles"]
    assert bibfiles == ["references.bib"]
    text = (BOOK / bibfiles[0]).read_text(encoding="utf-8")
    entries = split_entries(text)
    assert len(entries) >= 10
    assert text.count("@") == len(entries), "an @ outside a parsable @type{key, ...} entry"
    keys = [key for _, key, _ in entries]
    assert len(keys) == len(set(keys)), "duplicate bibtex keys"
    for kind, key, body in entries:
        assert kind in {"article", "inproceedings", "misc", "techreport", "book", "online"}, key
        assert re.search(r"^\s*title\s*=", body, re.MULTILINE | re.IGNORECASE), f"{key}: no title"
        year = re.search(r"^\s*year\s*=\s*[{\"]?(\d{4})", body, re.MULTILINE | re.IGNORECASE)
        assert year, f"{key}: no four-digit year"


def test_local_extensions_are_configured(config: dict[str, Any]) -> None:
    extensions = config["sphinx"]["local_extensions"]
    assert extensions == {"chapter_numbers": "_ext", "offline_pages": "_ext", "page_layout": "_ext"}
    for name in extensions:
        assert (BOOK / "_ext" / f"{name}.py").is_file()
    # Without a default the theme logs "Got invalid theme mode" on a reader's first visit.
    assert config["sphinx"]["config"]["html_context"]["default_mode"] in ("light", "dark", "auto")


MAX_CELL_LINES = 30  # a reader can take in a cell at a glance; longer ones split where they pause


def test_no_code_cell_is_longer_than_a_glance() -> None:
    long = []
    for path in sorted((BOOK / "chapters").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            lines = "".join(cell["source"]).strip("\n").count("\n") + 1
            if cell["cell_type"] == "code" and lines > MAX_CELL_LINES:
                long.append(f"{path.name} cell {i}: {lines} lines")
    assert long == [], f"split these at a pause, {MAX_CELL_LINES} lines at most: {long}"
