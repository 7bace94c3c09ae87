"""The book's own stylesheet, ``css/page_layout.css``: code sized and wrapped to fit the text
column, and a wider page on wide screens (the stylesheet says why).

Added through Sphinx's static path rather than a ``book/_static`` folder, which Jupyter Book
would scan for scripts to add to every page (see ``_config.yml``).
"""

from __future__ import annotations

from pathlib import Path

CSS_DIR = Path(__file__).with_name("css")
STYLESHEET = "page_layout.css"


def _add_static_path(app, config) -> None:
    if str(CSS_DIR) not in config.html_static_path:
        config.html_static_path.append(str(CSS_DIR))


def setup(app):
    app.connect("config-inited", _add_static_path)
    app.add_css_file(STYLESHEET)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
