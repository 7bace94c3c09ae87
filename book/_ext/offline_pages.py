"""Keep the built pages offline-clean: no script that points at a CDN, no console errors.

Two fixes, each found by the browser test (tests/browser):

1. Jupyter Book always loads sphinx-thebe (live code cells through Binder). We do not enable thebe,
yet sphinx-thebe still writes, on every page, an inline script declaring ``THEBE_JS_URL`` (an
unpkg.com address), twice, which makes the browser report "Identifier 'THEBE_JS_URL' has
already been declared", plus its loader script and stylesheet. This extension drops those three
from every page. The Colab and Binder launch buttons are plain links and stay.
2. The saved ipywidgets state is rendered by ipywidgets' HTML manager, which looks for its fonts
at a page-relative path and typesets math with MathJax 2's API (the book loads MathJax 3).
``js/widgets_requirejs_paths.js`` points it at the vendored copy (before RequireJS loads), and
``js/widgets_mathjax2_shim.js`` bridges the one MathJax call (after Sphinx's MathJax
configuration).
"""

from __future__ import annotations

from pathlib import Path

JS = Path(__file__).with_name("js")
REQUIREJS_PATHS = JS / "widgets_requirejs_paths.js"
MATHJAX2_SHIM = JS / "widgets_mathjax2_shim.js"

_THEBE_FILES = ("sphinx-thebe.js", "sphinx-thebe.css")


def _is_thebe(asset) -> bool:
    filename = getattr(asset, "filename", None) or str(asset)
    body = getattr(asset, "attributes", {}).get("body", "")
    return filename.endswith(_THEBE_FILES) or "THEBE_JS_URL" in (body or "")


def drop_thebe(app, pagename, templatename, context, doctree) -> None:
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [asset for asset in context[key] if not _is_thebe(asset)]


def setup(app):
    app.connect("html-page-context", drop_thebe)
    # Sphinx adds the MathJax 3 configuration, and myst-nb RequireJS, per page at priority 500.
    app.add_js_file(None, body=REQUIREJS_PATHS.read_text(encoding="utf-8"), priority=200)
    app.add_js_file(None, body=MATHJAX2_SHIM.read_text(encoding="utf-8"), priority=510)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
