"""benchmarks/notebook_times.py: each notebook's run time from a JUnit report, and the committed
record that every chapter ran within its budget at the ci preset."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tutorial_lib.bench import load_results

ROOT = Path(__file__).resolve().parents[1]
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.test_a" name="test_unit" time="2.0"/>
<testcase classname="book._executed.chapters.01_a" name="01_a.ipynb" time="41.26"/>
<testcase classname="book._executed.chapters.02_b" name="02_b.ipynb" time="95.0"/>
<testcase classname="book._executed.chapters.03_c" name="03_c.ipynb" time="240.4">
  <failure message="Failed: Timeout &gt;240.0s">Timeout</failure></testcase>
<testcase classname="book._executed.chapters.00_z" name="00_z.ipynb" time="12.0">
  <failure message="nbmake.pytest_items.NotebookFailedException">cell 3</failure></testcase>
</testsuite></testsuites>
"""


@pytest.fixture
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("notebook_times.py")


def test_rows_from_a_junit_report(bench: ModuleType, tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(JUNIT)
    rows = bench.notebook_rows(report, budget_s=90)
    assert [r["notebook"] for r in rows] == ["00_z.ipynb", "01_a.ipynb", "02_b.ipynb", "03_c.ipynb"]
    by = {r["notebook"]: r for r in rows}
    assert by["01_a.ipynb"] == {
        "notebook": "01_a.ipynb",
        "seconds": 41.3,
        "outcome": "passed",
        "within_budget": True,
    }
    assert by["02_b.ipynb"]["within_budget"] is False  # passed, but over the budget
    assert by["03_c.ipynb"]["outcome"].startswith("timed out (Failed: Timeout >240.0s")
    assert by["00_z.ipynb"]["outcome"] == "failed"
    late = bench.problems(rows, 90)
    assert len(late) == 3 and late[1] == "02_b.ipynb: passed, 95 s (budget 90 s)"


def test_main_writes_a_stamped_record_and_checks(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.xml"
    report.write_text(JUNIT)
    out = tmp_path / "results"
    assert bench.main(["--junit", str(report), "--out", str(out)]) == 0  # records, no check
    assert bench.main(["--junit", str(report), "--out", str(out), "--check"]) == 1
    assert "over budget: 02_b.ipynb" in capsys.readouterr().err
    (path,) = out.glob("notebook_times__*.json")
    record = json.loads(path.read_text())
    assert record["environment"]["device_type"] == "cpu"
    assert "matrix instructions" in record["environment"]["device_summary"]  # the CPU, described
    assert record["meta"]["budget_s"] == 90 and record["meta"]["total_s"] == pytest.approx(388.7)
    assert record["meta"]["inductor_cache"] == "unknown"


def test_clear_errors(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--junit", str(tmp_path / "none.xml")]) == 1
    assert "No JUnit report at" in capsys.readouterr().err
    (tmp_path / "bad.xml").write_text("<testsuites>")
    assert bench.main(["--junit", str(tmp_path / "bad.xml")]) == 1
    assert "not a readable JUnit XML report" in capsys.readouterr().err
    (tmp_path / "unit.xml").write_text('<testsuite><testcase name="test_x" time="1"/></testsuite>')
    assert bench.main(["--junit", str(tmp_path / "unit.xml")]) == 1
    assert "no notebook test cases" in capsys.readouterr().err


def _newest(name: str) -> dict:
    records = load_results(name, ROOT / "benchmarks" / "results")
    assert records, (
        f"no {name} record in benchmarks/results: run make test, then "
        "python benchmarks/notebook_times.py --out benchmarks/results"
    )
    newest = records[0]
    chapters = sorted(p.name for p in (ROOT / "book" / "chapters").glob("*.ipynb"))
    assert [r["notebook"] for r in newest["rows"]] == chapters  # every chapter, no stale one
    assert newest["environment"]["device"] and newest["environment"]["preset"] == "ci"
    return newest


def test_the_committed_record_has_every_chapter_within_budget(bench: ModuleType) -> None:
    """The newest recorded run with Inductor's cache warm: every chapter passed in under 90 s."""
    newest = _newest("notebook_times")
    assert newest["meta"]["inductor_cache"] == "warm"
    assert newest["meta"]["budget_s"] <= bench.BUDGET_S
    for row in newest["rows"]:
        assert row["outcome"] == "passed" and row["seconds"] <= 90, row


def test_the_cold_cache_record_stays_within_the_hard_limit() -> None:
    """The first run on a fresh clone (cold Inductor cache, compiling dominates chapters 7 and
    8): every chapter passed within make test's 180 s per-notebook limit."""
    newest = _newest("notebook_times_cold")
    assert newest["meta"]["inductor_cache"] == "cold"
    makefile = (ROOT / "Makefile").read_text()
    assert "--timeout=180" in makefile.split("TEST_LIMITS :=")[1].splitlines()[0]
    for row in newest["rows"]:
        assert row["outcome"] == "passed" and row["seconds"] < 180, row
