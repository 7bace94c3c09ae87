"""Number figures, tables and exercises per chapter: "Fig. 4.2", "Exercise 7.1".

Without a numbered toctree Sphinx counts every numbered object across the whole book, so the
first exercise of chapter 4 was "Exercise 11". Our chapters carry their numbers in their titles
("# 4. FP8 number formats") and file names (``chapters/04_fp8_formats``), and are not in a
numbered toctree (that would print "4. 4. FP8 ..."). After Sphinx has assigned its global numbers,
this extension renumbers every object of a chapter as (chapter, position in the chapter), which
both captions and ``{numref}`` cross-references read. Pages outside ``chapters/`` keep Sphinx's
numbers.
"""

from __future__ import annotations

import re

_CHAPTER = re.compile(r"^chapters/(\d+)_")


def chapter_of(docname: str) -> int | None:
    """The chapter number of a document, from its file name, or None for other pages."""
    match = _CHAPTER.match(docname)
    return int(match.group(1)) if match else None


def renumber(app, env) -> list[str]:
    for docname, by_type in env.toc_fignumbers.items():
        chapter = chapter_of(docname)
        if chapter is None:
            continue
        for numbers in by_type.values():
            in_order = sorted(numbers, key=numbers.__getitem__)
            for position, node_id in enumerate(in_order, start=1):
                numbers[node_id] = (chapter, position)
    return []


def setup(app):
    # After Sphinx's own TocTreeCollector (priority 500) has assigned the global numbers.
    app.connect("env-get-updated", renumber, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
