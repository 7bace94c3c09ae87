"""What the browser test looks at on a page: the table of contents, and one visit per page."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TOC = ROOT / "book" / "_toc.yml"
BUILD = ROOT / "book" / "_build"
SITE = BUILD / "html"  # `make html` builds it here
SLIDES = BUILD / "slides"  # `make slides`
SCREENSHOTS = BUILD / "screenshots"
CHAPTER_NOTEBOOKS = sorted(p.stem for p in (ROOT / "book" / "chapters").glob("*.ipynb"))
LOCAL = ("http://127.0.0.1", "http://localhost", "data:", "blob:", "about:")

# TeX that should have become MathJax output: a TeX command, or a $$ left in the text.
RAW_TEX = re.compile(r"\\(frac|times|cdot|sum|text|mathrm|approx|sqrt|left|right|log|le|ge)\b|\$\$")


def toc_pages(toc: Path = TOC) -> list[str]:
    """Every page of the table of contents, in reading order (docnames without suffix)."""
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    pages = [data["root"]]

    def walk(entries):
        for entry in entries or ():
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    for part in data.get("parts", ()):
        walk(part.get("chapters"))
    return pages


def chapter_number(docname: str) -> int | None:
    match = re.match(r"chapters/(\d+)_", docname)
    return int(match.group(1)) if match else None


@dataclass
class PageReport:
    """What one visit saw."""

    url: str
    console_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    facts: dict = field(default_factory=dict)


# Evaluated in the page once it has loaded and MathJax has typeset it.
_FACTS_JS = """
() => {
  const article = document.querySelector("article") || document.body;
  const imgs = [...document.images].map(i => ({
    src: i.getAttribute("src"), ok: i.complete && i.naturalWidth > 0}));
  const math = [...article.querySelectorAll(".math")];
  const clone = article.cloneNode(true);
  clone.querySelectorAll("pre, code, script, style, .math, mjx-container, .highlight")
       .forEach(e => e.remove());
  // Plots in cell outputs; a widget's own rendering (its saved state) is not a figure.
  const views = [...article.querySelectorAll(
    'script[type="application/vnd.jupyter.widget-view+json"]')];
  const outputImgs = [...article.querySelectorAll(".cell_output img")].filter(
    i => !i.closest(".jupyter-widgets"));
  return {
    title: document.title,
    images: imgs,
    math: math.length,
    mathRendered: math.filter(m => m.querySelector("mjx-container")).length,
    mathErrors: article.querySelectorAll("mjx-merror").length,
    text: clone.innerText,
    prev: document.querySelector("a.left-prev")?.getAttribute("href") ?? null,
    next: document.querySelector("a.right-next")?.getAttribute("href") ?? null,
    colab: document.querySelectorAll('a[href*="colab.research.google.com"]').length,
    binder: document.querySelectorAll('a[href*="mybinder.org"]').length,
    download: [...document.querySelectorAll("a[href]")].filter(
      a => a.getAttribute("href").endsWith(".ipynb")).length,
    figures: [...article.querySelectorAll("figure")].map(f => ({
      id: f.id, caption: (f.querySelector("figcaption")?.innerText ?? "").trim()})),
    outputImages: outputImgs.length,
    outputImagesInFigures: outputImgs.filter(i => i.closest("figure")).length,
    exercises: [...article.querySelectorAll(".exercise .admonition-title")].map(
      t => t.innerText.trim()),
    widgetViews: views.length,
    // The renderer puts each view's widget next to its script tag.
    widgetsRendered: views.filter(v => v.parentElement?.querySelector(".jupyter-widgets")).length,
    // Code blocks (cell inputs, listings, outputs) wider than the text column: the reader
    // would have to scroll sideways. Outputs may scroll (a wide table is data, not code).
    overflowingCode: [...article.querySelectorAll("div.highlight pre")]
      .filter(p => !p.closest(".cell_output, .output"))
      .filter(p => p.scrollWidth > p.clientWidth + 1)
      .map(p => ({first: p.innerText.split("\\n").find(l => l.length > 60)?.slice(0, 90) ?? "",
                  overflow: p.scrollWidth - p.clientWidth})),
    // The text's own links, not the prev/next buttons at the foot of the article.
    links: [...article.querySelectorAll("a[href]")].filter(a => !a.closest(".prev-next-area"))
      .map(a => a.getAttribute("href")),
  };
}
"""


MATHJAX_DONE_JS = "() => (window.MathJax && MathJax.startup && MathJax.startup.promise) || null"

# A workshop deck's text budget, as the audience sees it (speaker notes excluded). The same
# numbers are enforced when the deck is built (scripts/slide_outline.py), from the outline.
SLIDES_PER_DECK = (10, 25)
MAX_SLIDE_WORDS = 60
MAX_SLIDE_BULLETS = 4

# Evaluated in a deck once reveal.js and MathJax are ready: visits every slide and measures it.
# Words are counted on the visible text with each typeset formula as one word; a slide's
# height is measured while it is the present one (reveal.js hides the others).
SLIDE_FACTS_JS = r"""
() => {
  const slides = [...document.querySelectorAll(".reveal .slides > section")];
  const height = Reveal.getConfig().height;
  Reveal.configure({transition: "none"});  // measure and screenshot without animations
  const facts = slides.map((section, i) => {
    Reveal.slide(i);
    const clone = section.cloneNode(true);
    clone.querySelectorAll("aside.notes").forEach(e => e.remove());
    clone.querySelectorAll("mjx-container").forEach(e => e.replaceWith(" M "));
    const visible = [...section.children].filter(e => !e.matches("aside.notes"));
    const imgs = [...section.querySelectorAll("img")];
    return {
      headline: (section.querySelector("h1, h2")?.textContent ?? "").trim(),
      words: clone.textContent.split(/\s+/).filter(w => w).length,
      text: clone.textContent,
      bullets: visible.map(e => e.querySelectorAll("li").length).reduce((a, b) => a + b, 0),
      figure: section.dataset.figure ?? null,
      images: imgs.map(img => ({src: img.getAttribute("src"),
                                ok: img.complete && img.naturalWidth > 0,
                                height: img.getBoundingClientRect().height})),
      notes: (section.querySelector("aside.notes")?.textContent ?? "").trim().length,
      height: section.scrollHeight,
      overflow: section.scrollHeight > height,
      math: section.querySelectorAll(":scope > :not(aside) .math").length,
      mathRendered: [...section.querySelectorAll(":scope > :not(aside) .math")].filter(
        m => m.querySelector("mjx-container")).length,
    };
  });
  Reveal.slide(0);
  return facts;
}
"""


def watch(page, report: PageReport) -> None:
    """Record ``page``'s console errors, failed loads and HTTP errors into ``report``, and block
    (and record) every request that leaves localhost."""
    page.on(
        "console",
        lambda msg: report.console_errors.append(msg.text) if msg.type == "error" else None,
    )
    page.on("pageerror", lambda exc: report.console_errors.append(f"uncaught: {exc}"))
    page.on("requestfailed", lambda req: report.failed_requests.append(req.url))
    page.on(
        "response",
        lambda resp: (
            report.failed_requests.append(f"{resp.status} {resp.url}")
            if resp.status >= 400
            else None
        ),
    )

    def route(r):
        if r.request.url.startswith(LOCAL):
            r.continue_()
        else:
            report.external_requests.append(r.request.url)
            r.abort()

    page.route("**/*", route)


def settle(report: PageReport) -> PageReport:
    """Report each failure once: blocked requests also fail, and a 404 also prints "Failed to
    load resource" on the console (``failed_requests`` names the URL)."""
    report.failed_requests = [
        u for u in report.failed_requests if u not in report.external_requests
    ]
    report.console_errors = [
        e for e in report.console_errors if not e.startswith("Failed to load resource")
    ]
    return report


def visit(browser, url: str, screenshot: Path | None = None) -> PageReport:
    """Open ``url`` in a fresh page, wait for math and widgets, and collect what it shows."""
    report = PageReport(url)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    watch(page, report)
    try:
        page.goto(url, wait_until="load")
        page.evaluate(MATHJAX_DONE_JS)
        if page.locator('script[type="application/vnd.jupyter.widget-view+json"]').count():
            # The widget manager (RequireJS + embed-amd.js) renders the saved state after load.
            page.wait_for_function(
                """() => [...document.querySelectorAll(
                      'script[type="application/vnd.jupyter.widget-view+json"]')]
                    .every(v => v.parentElement.querySelector(".jupyter-widgets"))""",
                timeout=30_000,
            )
        page.wait_for_load_state("networkidle")
        report.facts = page.evaluate(_FACTS_JS)
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
    finally:
        page.close()
    return settle(report)
