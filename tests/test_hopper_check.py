"""The device check (``scripts/hopper_check.py``): its stages, timeouts and the files it returns.

One test runs the real thing as ``--dry-run`` (the ci preset, every stage, shortened); the others
drive it with a fake clock and fake subprocesses to check each way a stage can end.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["env", "smoke", "precision", "fp8", "fusion", "ladder"]
CHAPTERS = sorted(p.stem for p in (ROOT / "book" / "chapters").glob("*.ipynb"))
# What the lent GPU machine returns: at most 8 files of at most 16 MiB, at most 2 folders deep.
MAX_FILES, MAX_BYTES = 8, 16 * 2**20


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "hopper_check", ROOT / "scripts" / "hopper_check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hopper_check"] = module
    spec.loader.exec_module(module)
    return module


hc = _load()


def _returned(out: Path) -> list[Path]:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES, files
    for p in files:
        assert p.stat().st_size <= MAX_BYTES and len(p.relative_to(out).parts) <= 3, p
    return files


def test_dry_run_runs_every_stage_and_returns_its_files(tmp_path: Path, record_property) -> None:
    budget, chapters = 150, ["03_bf16_mixed_precision", "04_fp8_formats", "05_delayed_scaling"]
    argv = [
        "--dry-run",
        "--out",
        str(tmp_path),
        "--budget-s",
        str(budget),
        "--chapters",
        ",".join(chapters),
    ]
    proc = subprocess.run(
        [sys.executable, "scripts/hopper_check.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    report_md = tmp_path / "report.md"
    smoke_json = tmp_path / "smoke.json"
    why = [p.read_text() for p in (report_md, smoke_json) if p.is_file()] + [proc.stderr[-3000:]]
    assert proc.returncode == 0, "\n".join(why)
    names = {p.name for p in _returned(tmp_path)}
    assert names == {"report.json", "report.md", "smoke.json", "results.tar.gz"}
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and report["preset"] == "ci"
    assert [s["name"] for s in report["stages"]] == STAGES
    assert all(s["status"] == "ok" for s in report["stages"])
    for stage in report["stages"][1:]:
        assert stage["timeout_s"] <= hc.CAPS[stage["name"]][1]  # the dry run's caps
    # the notebooks run in order while the budget lasts (how many depends on this machine's speed)
    assert [n["name"] for n in report["notebooks"]] == chapters
    statuses = [n["status"] for n in report["notebooks"]]
    assert set(statuses) <= {"ok", "cut", "not run"} and statuses[0] == "ok"
    assert report["elapsed_s"] <= budget + 15
    smoke = json.loads((tmp_path / "smoke.json").read_text())
    assert {r["group"] for r in smoke} == {"kernel", "gemm", "train"} and all(
        r["ok"] for r in smoke
    )
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        packed = {m.name.split("__")[0] for m in tar.getmembers()}
    assert {"precision", "fp8_gemm", "fusion", "ladder", "hopper_check"} <= packed
    record_property(
        "report",
        f"hopper_check --dry-run: {len(STAGES)} stages, notebooks {dict(zip(chapters, statuses, strict=True))}, "
        f"{report['elapsed_s']:.0f} s of {budget}",
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """A stage 'takes' ``seconds[name]`` (default 5) or, when its code is None, its whole
    timeout; it writes a result file, and checks that the report of the stages before it is
    already in ``OUT`` (each stage's result is written the moment it ends)."""

    def __init__(self, clock: FakeClock, out: Path, seconds=None, codes=None) -> None:
        self.clock, self.out = clock, out
        self.seconds, self.codes = seconds or {}, codes or {}
        self.calls: list[tuple[str, float]] = []

    def __call__(self, argv: Sequence[str], env: dict[str, str], timeout: float) -> int | None:
        name = _stage(argv)
        done = json.loads((self.out / "report.json").read_text())
        assert [s["name"] for s in done["stages"] + done["notebooks"]][-1] != name
        self.calls.append((name, timeout))
        code = self.codes.get(name, 0)
        self.clock.now += timeout if code is None else self.seconds.get(name, 5.0)
        results = Path(env["TUTORIAL_RESULTS_DIR"])
        (results / f"{name}__fake__hopper__2026-12-04.json").write_text("{}")
        return code


def _stage(argv: Sequence[str]) -> str:
    if "--ladder" in argv:
        return "ladder"
    if "--nbmake" in argv:
        return Path(argv[-1]).stem
    return Path(argv[1]).stem.removeprefix("device_")


STAMP = {
    "date": "2026-12-04T10:00:00+00:00",
    "device": "NVIDIA H200",
    "device_type": "cuda",
    "device_summary": "NVIDIA H200 (cuda, sm_90)",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "triton": "3.6.0",
}


def _main(
    tmp_path: Path, monkeypatch, seconds=None, codes=None, args=()
) -> tuple[int, dict, FakeRunner]:
    clock = FakeClock()
    monkeypatch.setattr(hc.time, "monotonic", clock)
    runner = FakeRunner(clock, tmp_path, seconds, codes)
    code = hc.main(
        ["--out", str(tmp_path), *args], runner=runner, stamp=lambda p: {**STAMP, "preset": p}
    )
    return code, json.loads((tmp_path / "report.json").read_text()), runner


def test_stages_run_in_order_of_value_within_their_caps(tmp_path: Path, monkeypatch) -> None:
    code, report, runner = _main(tmp_path, monkeypatch, seconds={c: 40.0 for c in CHAPTERS})
    assert code == 0 and report["preset"] == "hopper"
    assert [n for n, _ in runner.calls][:5] == STAGES[1:]
    for name, timeout in runner.calls[:5]:
        assert timeout == hc.CAPS[name][0]
    # 5 stages of 5 s leave 365 s: eleven 40-s notebooks do not fit, the last ones are not run
    ran = [n["name"] for n in report["notebooks"] if n["status"] == "ok"]
    assert ran == CHAPTERS[: len(ran)] and 0 < len(ran) < len(CHAPTERS)
    assert all(n["detail"].startswith("no time left") for n in report["notebooks"][len(ran) :])
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        assert {m.name.split("__")[0] for m in tar.getmembers()} >= {*STAGES[1:], "hopper_check"}
    _returned(tmp_path)


def test_a_stage_that_times_out_is_reported_and_the_rest_still_run(
    tmp_path: Path, monkeypatch
) -> None:
    code, report, runner = _main(tmp_path, monkeypatch, codes={"fusion": None})
    assert code == 1 and not report["ok"]
    fusion = next(s for s in report["stages"] if s["name"] == "fusion")
    assert fusion["status"] == "timed out" and fusion["seconds"] == hc.CAPS["fusion"][0]
    assert [n for n, _ in runner.calls][4] == "ladder"
    assert "timed out" in (tmp_path / "report.md").read_text()


def test_a_notebook_cut_by_the_budget_is_not_a_failure(tmp_path: Path, monkeypatch) -> None:
    """Chapter 7 is estimated at about 3 minutes: the 5 minutes left are less than 3x that."""
    code, report, _ = _main(tmp_path, monkeypatch, codes={"07_kernel_fusion": None})
    assert code == 0 and report["ok"]
    cut = report["notebooks"][6]
    assert cut["status"] == "cut" and cut["detail"].startswith("the budget ran out")
    assert {n["status"] for n in report["notebooks"][7:]} == {"not run"}


def test_a_notebook_far_past_its_estimate_on_a_gpu_is_a_hang(tmp_path: Path, monkeypatch) -> None:
    """On a GPU, a notebook that had three times its estimated time (book_cost) and was still
    running has hung: a failure, not a cut."""
    code, report, _ = _main(tmp_path, monkeypatch, codes={"05_delayed_scaling": None})
    hung = report["notebooks"][4]
    assert code == 1 and hung["status"] == "timed out" and "its estimate" in hung["detail"]


def test_a_failed_stage_fails_the_run(tmp_path: Path, monkeypatch) -> None:
    code, report, _ = _main(tmp_path, monkeypatch, codes={"01_gpt_in_plain_pytorch": 3})
    assert code == 1
    assert (
        report["notebooks"][0]["status"] == "failed"
        and report["notebooks"][0]["detail"] == "exit status 3"
    )


def test_a_small_budget_runs_nothing_past_it(tmp_path: Path, monkeypatch) -> None:
    code, report, runner = _main(
        tmp_path, monkeypatch, codes={"smoke": None}, args=("--budget-s", "60")
    )
    assert runner.calls == [("smoke", 60.0)]  # the smoke stage's cap is larger than the budget
    assert [s["status"] for s in report["stages"]][1:] == ["timed out"] + ["not run"] * 4
    assert code == 1 and all(n["status"] == "not run" for n in report["notebooks"])


@pytest.mark.parametrize("argv", [["--dry-run"], []])
def test_defaults(argv: list[str], tmp_path: Path) -> None:
    args = hc.parse_args(["--out", str(tmp_path), *argv])
    assert (args.preset, args.budget_s) == (
        ("ci", hc.DRY_BUDGET_S) if argv else ("hopper", hc.BUDGET_S)
    )
    assert (
        2 * 60 + 2 * hc.BUDGET_S <= 15 * 60
    )  # a start and two tries fit in the device's 15 minutes
