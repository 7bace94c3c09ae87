#!/usr/bin/env python3
"""The package's size against the design's budgets (``make lint`` prints it; it fails nothing yet).

    python scripts/line_count.py [--package tutorial_lib]

Budgets (``../shared/DESIGN.md``): the package within 18,000 lines, its reader-facing core within
10,000, no module over 400. The core is everything but ``cluster/``, ``bench/``, ``exercises/``,
the command line (``__main__.py``, ``cli.py``) and the readiness check (``readiness.py``, ``machine_probe.py``,
``book_cost.py``). Lines are physical lines of ``.py`` files, docstrings and comments included.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_BUDGET, CORE_BUDGET, MODULE_BUDGET = 18_000, 10_000, 400
OUTSIDE_CORE = ("cluster", "bench", "exercises")
READINESS = ("__main__.py", "cli.py", "readiness.py", "machine_probe.py", "book_cost.py")


def count(package: Path) -> tuple[int, int, list[tuple[int, str]]]:
    """``(package lines, core lines, [(lines, module) over the module budget])``."""
    total = core = 0
    large = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        n = len(path.read_text(encoding="utf-8").splitlines())
        total += n
        if rel.parts[0] not in OUTSIDE_CORE and rel.name not in READINESS:
            core += n
        if n > MODULE_BUDGET:
            large.append((n, str(rel)))
    return total, core, sorted(large, reverse=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--package", type=Path, default=ROOT / "tutorial_lib")
    args = p.parse_args(argv)
    total, core, large = count(args.package)
    print(
        f"line count: package {total:,} (budget {PACKAGE_BUDGET:,}), core {core:,} "
        f"(budget {CORE_BUDGET:,}), {len(large)} modules over {MODULE_BUDGET} lines"
        + (": " + ", ".join(f"{m} {n}" for n, m in large) if large else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
