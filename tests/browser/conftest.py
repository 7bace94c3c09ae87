"""Fixtures for the browser test of the built book: a local web server and headless Chromium.

The site must have been built first (`make test` and `make book` do it; `make html` rebuilds it
from executed notebooks). Chromium is Debian's package, driven by Playwright; nothing is
downloaded, and every request that leaves localhost is blocked and reported.
"""

from __future__ import annotations

import functools
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from site_checks import SCREENSHOTS

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
# What Chromium needs in a closed network: no background connections (they would be refused,
# many at a time), no GPU, a fresh profile.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="session")
def serve():
    """``serve(folder) -> base URL``: a static file server on 127.0.0.1 for the session."""
    servers = []

    def start(folder: Path) -> str:
        if not (folder / "index.html").is_file():
            pytest.fail(
                f"{folder} holds no built site (no index.html). Build it first: `make test` or "
                "`make book` (which execute the notebooks), or `make html` after `make executed`."
            )
        handler = functools.partial(_QuietHandler, directory=str(folder))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.is_file():
        pytest.fail(
            f"no Chromium at {CHROMIUM}. `make browser-deps` installs Debian's chromium package; "
            "or set CHROMIUM=/path/to/chromium."
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
