"""The built book, as a reader sees it in a browser (headless Chromium, driven by Playwright).

Run by `make test` after the HTML book and the slides are built from the executed notebooks.
Every page of the table of contents must load without console errors and without reaching
outside localhost, show every image, render its math, link to its neighbours, and (for the
chapters) carry launch and download buttons, captioned figures, per-chapter exercise numbers
and rendered widget state. One full-page screenshot per page lands in book/_build/screenshots/.
"""

from __future__ import annotations

from urllib.parse import unquote, urljoin, urlparse

import pytest
from site_checks import (
    CHAPTER_NOTEBOOKS,
    MATHJAX_DONE_JS,
    MAX_SLIDE_BULLETS,
    MAX_SLIDE_WORDS,
    RAW_TEX,
    SITE,
    SLIDE_FACTS_JS,
    SLIDES,
    SLIDES_PER_DECK,
    PageReport,
    chapter_number,
    settle,
    toc_pages,
    visit,
    watch,
)

PAGES = toc_pages()


def _resolve(base: str, href: str) -> str:
    """The site-relative path (no fragment) that ``href`` on page ``base`` points to."""
    return unquote(urlparse(urljoin(base, href)).path).lstrip("/")


@pytest.fixture(scope="module")
def site_url(serve):
    return serve(SITE)


@pytest.mark.parametrize("docname", PAGES)
def test_page(docname, browser, site_url, screenshots):
    url = f"{site_url}{docname}.html"
    shot = screenshots / f"{docname.replace('/', '__')}.png"
    report = visit(browser, url, screenshot=shot)
    facts = report.facts

    assert not report.console_errors, f"{docname}: console errors {report.console_errors}"
    assert not report.external_requests, (
        f"{docname}: loads from outside: {report.external_requests}"
    )
    assert not report.failed_requests, f"{docname}: failed to load {report.failed_requests}"
    broken = [img["src"] for img in facts["images"] if not img["ok"]]
    assert not broken, f"{docname}: images that did not load: {broken}"
    assert shot.stat().st_size > 10_000, f"{docname}: screenshot {shot} looks empty"

    # Math: every math element typeset by MathJax, no TeX errors, no raw TeX left in the prose.
    assert facts["mathRendered"] == facts["math"], (
        f"{docname}: {facts['math'] - facts['mathRendered']} of {facts['math']} math elements "
        "not rendered by MathJax"
    )
    assert facts["mathErrors"] == 0, f"{docname}: {facts['mathErrors']} MathJax errors"
    raw = RAW_TEX.search(facts["text"])
    assert raw is None, (
        f"{docname}: raw TeX in the text near {facts['text'][max(0, raw.start() - 60) : raw.end() + 20]!r}"
    )

    # Code fits the text column (issue #16): no code block scrolls sideways.
    assert not facts["overflowingCode"], (
        f"{docname}: code wider than the column, {len(facts['overflowingCode'])} blocks: "
        f"{facts['overflowingCode'][:3]}"
    )

    # Navigation: previous and next follow the table of contents.
    i = PAGES.index(docname)
    expected_prev = PAGES[i - 1] + ".html" if i > 0 else None
    expected_next = PAGES[i + 1] + ".html" if i + 1 < len(PAGES) else None
    got_prev = _resolve(url, facts["prev"]) if facts["prev"] else None
    got_next = _resolve(url, facts["next"]) if facts["next"] else None
    assert (got_prev, got_next) == (expected_prev, expected_next), f"{docname}: prev/next links"

    # Internal links point at pages that exist.
    missing = sorted(
        {
            target
            for href in facts["links"]
            if not href.startswith(("http:", "https:", "mailto:", "#"))
            and not (SITE / (target := _resolve(url, href))).exists()
        }
    )
    assert not missing, f"{docname}: links to missing files {missing}"

    chapter = chapter_number(docname)
    if chapter is None:
        return
    assert facts["colab"] and facts["binder"], f"{docname}: Colab/Binder launch buttons missing"
    assert facts["download"], f"{docname}: no download-notebook (.ipynb) button"
    assert facts["outputImages"] > 0, f"{docname}: a chapter without a single figure"
    assert facts["outputImagesInFigures"] == facts["outputImages"], (
        f"{docname}: {facts['outputImages'] - facts['outputImagesInFigures']} plots without a "
        "figure caption (give the cell mystnb.figure metadata)"
    )
    uncaptioned = [f["id"] for f in facts["figures"] if not f["caption"]]
    assert not uncaptioned, f"{docname}: figures without captions {uncaptioned}"
    assert facts["exercises"], f"{docname}: no exercises"
    others = {
        target
        for href in facts["links"]
        if (target := _resolve(url, href)).startswith("chapters/") and target != f"{docname}.html"
    }
    assert others, f"{docname}: no cross-reference to another chapter"
    wrong = [t for t in facts["exercises"] if not t.startswith(f"Exercise {chapter}.")]
    assert not wrong, f"{docname}: exercises not numbered per chapter: {wrong}"
    if facts["widgetViews"]:
        assert facts["widgetsRendered"] == facts["widgetViews"], (
            f"{docname}: {facts['widgetViews']} widgets, {facts['widgetsRendered']} rendered "
            "from the saved state"
        )


def test_next_buttons_walk_the_whole_book(browser, site_url):
    """Clicking "next" from the landing page visits every page in table-of-contents order."""
    page = browser.new_page()
    try:
        page.goto(site_url, wait_until="load")  # index.html redirects to the root page
        page.wait_for_url(f"**/{PAGES[0]}.html")
        visited = [PAGES[0]]
        while page.locator("a.right-next").count():
            page.locator("a.right-next").first.click()
            page.wait_for_load_state("load")
            visited.append(_resolve(page.url, page.url).removesuffix(".html"))
        assert visited == PAGES
        page.locator("a.left-prev").first.click()
        page.wait_for_load_state("load")
        assert _resolve(page.url, page.url) == PAGES[-2] + ".html"
    finally:
        page.close()


@pytest.fixture(scope="module")
def slides_url(serve):
    return serve(SLIDES)


@pytest.mark.parametrize("name", CHAPTER_NOTEBOOKS)
def test_slide_deck(name, browser, slides_url, screenshots):
    """A `make slides` workshop deck opens offline, starts reveal.js, and keeps to its budget:
    10 to 25 slides, each with a headline, at most 60 visible words and 4 bullets (speaker
    notes excluded), nothing taller than the slide, speaker notes, its figure's image loaded and
    its math typeset."""
    deck = SLIDES / f"{name}.slides.html"
    assert deck.is_file(), f"no slide deck {deck}: run `make slides`"
    report = PageReport(f"{slides_url}{deck.name}")
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    watch(page, report)
    try:
        page.goto(report.url, wait_until="load")
        page.wait_for_function("window.slidesReady === true", timeout=20_000)
        page.evaluate(MATHJAX_DONE_JS)
        page.wait_for_load_state("networkidle")
        total = page.evaluate("Reveal.getTotalSlides()")
        slides = page.evaluate(SLIDE_FACTS_JS)
        math_errors = page.evaluate("document.querySelectorAll('mjx-merror').length")
        page.screenshot(path=str(screenshots / f"slides__{name}.png"))
        first_figure = next((i for i, s in enumerate(slides) if s["figure"]), None)
        if first_figure is not None:
            page.evaluate(f"Reveal.slide({first_figure})")
            page.screenshot(path=str(screenshots / f"slides__{name}__figure.png"))
    finally:
        page.close()
    settle(report)
    assert not report.console_errors, f"{name}: console errors {report.console_errors}"
    assert not report.external_requests, f"{name}: loads from outside: {report.external_requests}"
    assert not report.failed_requests, f"{name}: failed to load {report.failed_requests}"
    low, high = SLIDES_PER_DECK
    assert low <= total <= high and total == len(slides), f"{name}: {total} slides"
    title = slides[0]["headline"]
    assert title.split(".")[0].strip() == str(int(name[:2])), f"{name}: first slide title {title!r}"
    assert math_errors == 0, f"{name}: {math_errors} MathJax errors"
    for number, slide in enumerate(slides, start=1):
        where = f"{name}, slide {number} ({slide['headline']!r})"
        assert slide["headline"], f"{where}: no headline"
        assert slide["words"] <= MAX_SLIDE_WORDS, f"{where}: {slide['words']} visible words"
        assert slide["bullets"] <= MAX_SLIDE_BULLETS, f"{where}: {slide['bullets']} bullets"
        assert not slide["overflow"], f"{where}: taller than the slide"
        assert slide["notes"] > 0, f"{where}: no speaker notes"
        assert slide["mathRendered"] == slide["math"], f"{where}: math not typeset"
        raw = RAW_TEX.search(slide["text"])
        assert raw is None, f"{where}: raw TeX {raw.group(0)!r} on the slide"
        broken = [img["src"] for img in slide["images"] if not img["ok"]]
        assert not broken, f"{where}: images that did not load: {broken}"
        if slide["figure"]:
            assert len(slide["images"]) == 1, f"{where}: a figure slide shows one image"
            assert slide["images"][0]["height"] > 200, f"{where}: the figure is tiny"
    figures = [s for s in slides if s["figure"]]
    assert figures, f"{name}: a deck without a single figure"


def test_speaker_view_shows_the_notes(browser, slides_url):
    """Pressing `s` opens reveal.js's speaker view, whose notes are the chapter's prose."""
    name = CHAPTER_NOTEBOOKS[0]
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    try:
        page.goto(f"{slides_url}{name}.slides.html#/1", wait_until="load")
        page.wait_for_function("window.slidesReady === true", timeout=20_000)
        expected = page.evaluate(
            "Reveal.getCurrentSlide().querySelector('aside.notes').textContent.trim()"
        )
        with page.expect_popup() as popup:
            page.keyboard.press("s")
        speaker = popup.value
        notes = speaker.locator(".speaker-controls-notes .value")
        notes.wait_for(timeout=20_000)
        speaker.wait_for_function(
            "document.querySelector('.speaker-controls-notes .value').textContent.trim() !== ''",
            timeout=20_000,
        )
        shown = notes.inner_text()
        speaker.close()
    finally:
        page.close()
    assert len(expected.split()) > 20, f"{name}: slide 2 has almost no speaker notes"
    assert expected.split()[:5] == shown.split()[:5], f"{name}: speaker view shows {shown[:80]!r}"
