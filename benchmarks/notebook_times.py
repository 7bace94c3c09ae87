"""Record how long each notebook took to execute, from the JUnit report of a pytest/nbmake run.

    python benchmarks/notebook_times.py [--junit book/_build/test-report.xml] [--out DIR]
                                        [--budget-s 90] [--check]

``make test`` runs every notebook under nbmake (``-n 2``: two at a time, after the unit tests,
one math thread each) and writes a JUnit XML report; this script reads the notebooks' rows from it and
writes ``notebook_times__<cpu>__<date>.json``/``.md`` through ``bench.write_results``, stamped
with the machine (CPU model and matrix instructions, torch, date). Each row: the notebook, its
seconds, its outcome, and whether it stayed within the budget (90 s at the ``ci`` preset on a
2-core CPU). ``--inductor-cache`` records whether ``torch.compile``'s on-disk cache was warm: on a
fresh machine, compiling the graphs of chapters 7 and 8 adds about a minute to each. ``--check`` exits 1 when a
notebook failed or went over the budget, naming it.

The hard stop is elsewhere: ``make test`` gives each test, notebooks included, a
``--timeout`` (pytest-timeout) and each cell ``--nbmake-timeout``, so a notebook that regresses
to minutes fails with its name instead of holding CI.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tutorial_lib.bench import environment_stamp, write_and_print

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JUNIT = REPO / "book" / "_build" / "test-report.xml"
DEFAULT_OUT = REPO / "benchmarks" / "results"
BUDGET_S = 90.0


def notebook_rows(junit: Path, budget_s: float = BUDGET_S) -> list[dict[str, Any]]:
    """One row per executed notebook in a JUnit report, in file name order."""
    if not junit.is_file():
        raise FileNotFoundError(
            f"No JUnit report at {junit}. Run `make test` (it writes one), or pytest with "
            f"--nbmake --junitxml={junit}."
        )
    try:
        root = ET.parse(junit).getroot()
    except ET.ParseError as exc:
        raise ValueError(f"{junit} is not a readable JUnit XML report: {exc}") from exc
    rows = []
    for case in root.iter("testcase"):
        name = case.get("name", "")
        if not name.endswith(".ipynb"):
            continue
        seconds = float(case.get("time", "nan"))
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                message = (found.get("message") or "").splitlines()
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                if message and "Timeout" in message[0]:
                    outcome = f"timed out ({message[0]})"
        rows.append(
            {
                "notebook": name,
                "seconds": round(seconds, 1),
                "outcome": outcome,
                "within_budget": outcome == "passed" and seconds <= budget_s,
            }
        )
    if not rows:
        raise ValueError(f"{junit} has no notebook test cases (names ending in .ipynb).")
    return sorted(rows, key=lambda r: r["notebook"])


def problems(rows: Sequence[dict[str, Any]], budget_s: float = BUDGET_S) -> list[str]:
    """A line per notebook that failed or took longer than the budget."""
    return [
        f"{r['notebook']}: {r['outcome']}, {r['seconds']:.0f} s (budget {budget_s:.0f} s)"
        for r in rows
        if not r["within_budget"]
    ]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--junit", type=Path, default=DEFAULT_JUNIT, help="pytest --junitxml report")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="seconds per notebook")
    p.add_argument("--check", action="store_true", help="exit 1 if a notebook is over budget")
    p.add_argument("--name", default="notebook_times", help="the record's benchmark name")
    p.add_argument(
        "--inductor-cache",
        choices=("warm", "cold", "unknown"),
        default="unknown",
        help="whether torch.compile's on-disk cache already held the notebooks' "
        "graphs (cold: a fresh machine or clone; compiling then dominates)",
    )
    p.add_argument(
        "--how",
        default="make test: pytest -n 2 --nbmake, two notebooks at a time "
        "after the unit tests, OMP_NUM_THREADS=1",
        help="how the notebooks ran",
    )
    args = p.parse_args(argv)
    if args.budget_s <= 0:
        p.error(f"--budget-s must be positive, got {args.budget_s}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rows = notebook_rows(args.junit, args.budget_s)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    env = environment_stamp("cpu")  # preset: TUTORIAL_PRESET, which make test sets to ci
    meta = {
        "budget_s": args.budget_s,
        "how": args.how,
        "inductor_cache": args.inductor_cache,
        "total_s": round(sum(r["seconds"] for r in rows), 1),
    }
    title = f"notebook run times, budget {args.budget_s:.0f} s each"
    write_and_print(args.name, title, rows, args.out, meta, env)
    late = problems(rows, args.budget_s)
    for line in late:
        print(f"over budget: {line}", file=sys.stderr)
    return 1 if args.check and late else 0


if __name__ == "__main__":
    sys.exit(main())
