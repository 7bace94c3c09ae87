"""scripts/line_count.py: the size budgets' arithmetic, on a package made here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("line_count", ROOT / "scripts" / "line_count.py")
assert spec is not None and spec.loader is not None
line_count = importlib.util.module_from_spec(spec)
sys.modules["line_count"] = line_count
spec.loader.exec_module(line_count)


def test_core_leaves_out_the_cluster_bench_exercises_cli_and_readiness(tmp_path: Path) -> None:
    files = {
        "model.py": 10,
        "fp8/linear.py": 401,
        "cluster/cost.py": 5,
        "bench/ladder.py": 7,
        "exercises/ch01.py": 3,
        "__main__.py": 2,
        "cli.py": 6,
        "readiness.py": 4,
    }
    for name, n in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * n)
    total, core, large = line_count.count(tmp_path)
    assert (total, core) == (sum(files.values()), 10 + 401)
    assert large == [(401, "fp8/linear.py")]
