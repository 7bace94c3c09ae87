"""The workshop agendas add up: every slot starts when the previous one ends, and the half day
is three hours."""

from __future__ import annotations

import re
from pathlib import Path

AGENDA = Path(__file__).resolve().parents[1] / "book" / "workshop" / "agenda.md"
ROW = re.compile(r"^\|\s*(\d\d):(\d\d)\s*\|\s*(?:(\d+) min)?\s*\|")


def agendas() -> dict[str, list[tuple[int, int | None]]]:
    """(start minute, duration) rows of every agenda table, by the heading above it."""
    tables: dict[str, list[tuple[int, int | None]]] = {}
    heading = None
    for line in AGENDA.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        match = ROW.match(line)
        if match and heading:
            hours, minutes, duration = match.groups()
            tables.setdefault(heading, []).append(
                (int(hours) * 60 + int(minutes), int(duration) if duration else None)
            )
    return tables


def test_agenda_slots_follow_each_other():
    tables = agendas()
    assert len(tables) == 2, f"expected a half-day and a full-day table, found {list(tables)}"
    for heading, rows in tables.items():
        assert rows[-1][1] is None, f"{heading}: the last row marks the end"
        for (start, duration), (next_start, _) in zip(rows[:-1], rows[1:], strict=True):
            assert start + duration == next_start, f"{heading}: gap or overlap at minute {start}"


def test_half_day_is_three_hours_and_full_day_eight():
    lengths = {h: rows[-1][0] - rows[0][0] for h, rows in agendas().items()}
    half = next(v for h, v in lengths.items() if h.lower().startswith("half day"))
    full = next(v for h, v in lengths.items() if h.lower().startswith("full day"))
    assert (half, full) == (180, 480)
