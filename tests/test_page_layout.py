"""book/_ext/page_layout.py: the stylesheet that keeps code within the text column is added to
every page (the browser test checks the result on the built site)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("page_layout", ROOT / "book/_ext/page_layout.py")
assert _spec and _spec.loader
page_layout = importlib.util.module_from_spec(_spec)
sys.modules["page_layout"] = page_layout
_spec.loader.exec_module(page_layout)


class FakeApp:
    def __init__(self) -> None:
        self.handlers: dict[str, list] = {}
        self.css: list[str] = []

    def connect(self, event: str, fn) -> None:
        self.handlers.setdefault(event, []).append(fn)

    def add_css_file(self, name: str) -> None:
        self.css.append(name)


def test_the_stylesheet_is_added_once_from_its_own_folder() -> None:
    app = FakeApp()
    meta = page_layout.setup(app)
    assert meta["parallel_read_safe"] and app.css == ["page_layout.css"]
    config = SimpleNamespace(html_static_path=["_vendor"])
    for _ in range(2):  # config-inited may run again on a rebuild
        (handler,) = app.handlers["config-inited"]
        handler(app, config)
    assert config.html_static_path == ["_vendor", str(page_layout.CSS_DIR)]
    assert sorted(p.name for p in page_layout.CSS_DIR.iterdir()) == ["page_layout.css"]


def test_code_cells_keep_their_lines_and_other_blocks_wrap() -> None:
    css = (page_layout.CSS_DIR / "page_layout.css").read_text(encoding="utf-8")
    bare = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules = {k.strip(): v for k, v in re.findall(r"([^{}]+)\{([^}]*)\}", bare)}
    wrap = rules['div[class*="highlight-"]:not(.highlight-ipython3) pre']
    assert "white-space: pre-wrap" in wrap  # listings, shell commands, doctests
    assert "pre-wrap" not in rules["div.highlight pre"]  # code cells: 79 columns, never wrapped


def test_the_book_loads_the_extension() -> None:
    config = (ROOT / "book" / "_config.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s+page_layout: _ext$", config, re.M)
    assert "line-length = 79" in (ROOT / "book" / "chapters" / "ruff.toml").read_text()


def test_every_notebook_code_line_fits_79_columns() -> None:
    """ruff's E501 lets a line ending in a URL through; the book's column does not."""
    import nbformat

    long = [
        f"{path.name} cell {i}: {line[:60]}..."
        for path in sorted((ROOT / "book" / "chapters").glob("*.ipynb"))
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells)
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if len(line) > 79
    ]
    assert not long, f"{len(long)} code lines over 79 characters: {long[:5]}"
