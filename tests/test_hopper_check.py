"""Tests for scripts/hopper_check.py (issue 9) with fake subprocesses: no benchmark runs here."""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    path = ROOT / "scripts" / "hopper_check.py"
    spec = importlib.util.spec_from_file_location("hopper_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hopper_check"] = module
    spec.loader.exec_module(module)
    return module


hc = _load()

STAMP = {
    "date": "2026-11-20T10:00:00+00:00",
    "device": "NVIDIA H200",
    "device_type": "cuda",
    "device_summary": "NVIDIA H200 (cuda, sm_90)",
    "driver": "580.159.04",
    "cuda": "13.0",
    "torch": "2.11.0+cu130",
    "triton": "3.6.0",
    "python": "3.12.3",
    "preset": "hopper",
}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """Records each call; a step 'takes' ``seconds[name]`` of the fake clock, may time out (uses
    its whole timeout, returns None), and writes a result file like the real scripts do."""

    def __init__(self, clock: FakeClock, results: Path, seconds=None, codes=None) -> None:
        self.clock, self.results = clock, results
        self.seconds, self.codes = seconds or {}, codes or {}
        self.calls: list[tuple[str, list[str], dict[str, str], float]] = []

    def __call__(self, argv: Sequence[str], env: dict[str, str], timeout: float) -> int | None:
        name = _step_name(argv)
        self.calls.append((name, list(argv), env, timeout))
        code = self.codes.get(name, 0)
        self.clock.now += timeout if code is None else self.seconds.get(name, 1.0)
        if name != "notebooks":
            self.results.mkdir(parents=True, exist_ok=True)
            rows = [{"policy": "te-fp8", "skipped": "Transformer Engine is not installed"}]
            record = {"benchmark": name, "environment": STAMP, "meta": {}, "rows": rows}
            (self.results / f"{name}__nvidia-h200__hopper__2026-11-20.json").write_text(
                json.dumps(record)
            )
            (self.results / f"{name}__nvidia-h200__hopper__2026-11-20.md").write_text("x")
        return code


def _step_name(argv: Sequence[str]) -> str:
    if "--ladder" in argv:
        return "ladder"
    if "--nbmake" in argv:
        return "notebooks"
    return Path(argv[1]).stem


def test_plan_steps_order_commands_and_selection(tmp_path: Path) -> None:
    steps = hc.plan_steps("hopper", tmp_path, "py")
    assert [s.name for s in steps] == ["precision", "fp8", "fusion", "ladder", "notebooks"]
    assert all(s.skip is None for s in steps)
    by = {s.name: s for s in steps}
    assert by["fp8"].argv == (
        "py",
        "benchmarks/fp8.py",
        "--preset",
        "hopper",
        "--out",
        str(tmp_path),
    )
    assert by["ladder"].argv[:5] == ("py", "-m", "tutorial_lib", "bench", "--ladder")
    nb = by["notebooks"].argv
    assert nb[:3] == ("py", "-m", "pytest") and "--nbmake" in nb and nb[-1] == "book/chapters"
    assert "--overwrite" not in nb and "--nbmake-timeout={timeout}" in nb
    assert by["notebooks"].env == {}  # on a GPU: no thread limit
    assert hc.plan_steps("hopper", tmp_path, "py", jobs=1)[-1].argv[3:5] == ("-n", "1")
    cpu = {s.name: s for s in hc.plan_steps("ci", tmp_path, "py", cpu=True)}
    assert cpu["notebooks"].env["OMP_NUM_THREADS"] == "1" and cpu["precision"].env == {}
    only = hc.plan_steps("ci", tmp_path, "py", only="fusion")
    assert [s.name for s in only if s.skip is None] == ["fusion"]
    assert "--only fusion" in only[0].skip
    no_nb = hc.plan_steps("ci", tmp_path, "py", skip_notebooks=True)
    assert [s.name for s in no_nb if s.skip] == ["notebooks"]


def test_step_timeout_keeps_the_later_reserves() -> None:
    # budget 480, later steps reserve 0.25 + 0.5 of it: 360 s kept, the rest is this step's
    assert hc.step_timeout(480, 480, [0.25, 0.5]) == pytest.approx(120)
    # an earlier step used 80 s: this one has 40 s, the later reserves are untouched
    assert hc.step_timeout(400, 480, [0.25, 0.5]) == pytest.approx(40)
    assert hc.step_timeout(480, 480, []) == 480  # the last step gets everything left
    assert hc.step_timeout(100, 480, [0.75]) == hc.MIN_STEP_S  # never below the floor...
    assert hc.step_timeout(10, 480, [0.75]) == 10  # ...unless less than that is left
    assert sum(hc.RESERVE.values()) < 1  # part of the budget goes to whoever needs it first


def test_run_steps_budget_flows_to_later_steps(tmp_path: Path) -> None:
    clock = FakeClock()
    runner = FakeRunner(clock, tmp_path, seconds={"precision": 5, "fp8": 5, "fusion": 5})
    steps = hc.plan_steps("hopper", tmp_path, "py")
    done = hc.run_steps(steps, "hopper", tmp_path, 580.0, runner, clock)
    assert [r.status for r in done] == ["ok"] * 5
    timeouts = {name: t for name, _, _, t in runner.calls}
    later = sum(v for k, v in hc.RESERVE.items() if k != "precision")
    assert timeouts["precision"] == pytest.approx(580 * (1 - later))
    assert timeouts["ladder"] == pytest.approx(580 - 15 - 580 * hc.RESERVE["notebooks"])
    # the notebooks, last, get all that is left: 580 s minus the 5 x 3 + 1 used before
    assert timeouts["notebooks"] == pytest.approx(580 - 16)
    nb_argv = runner.calls[-1][1]
    assert f"--nbmake-timeout={int(timeouts['notebooks'])}" in nb_argv
    env = runner.calls[0][2]
    assert env["TUTORIAL_PRESET"] == "hopper" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str(hc.ROOT) and "MPLBACKEND" not in env
    assert env["TUTORIAL_RESULTS_DIR"] == str(tmp_path)
    assert done[0].files == sorted(p.name for p in tmp_path.glob("precision__*"))
    assert done[-1].files == []


def test_timeout_fails_and_no_budget_is_incomplete(tmp_path: Path) -> None:
    clock = FakeClock()
    runner = FakeRunner(clock, tmp_path, codes={"precision": None, "fp8": 3})
    steps = hc.plan_steps("hopper", tmp_path, "py", only=None)
    done = hc.run_steps(steps, "hopper", tmp_path, 60.0, runner, clock)
    status = {r.name: (r.status, r.reason) for r in done}
    assert status["precision"] == ("failed", "timed out after 30 s")  # the floor, MIN_STEP_S
    assert status["fp8"] == ("failed", "exit status 3")
    assert hc.exit_code(done) == 1
    clock.now = 0.0
    late = hc.run_steps(steps, "hopper", tmp_path, 0.5, runner, clock)
    assert all(r.status == "skipped" and r.incomplete for r in late)
    assert hc.exit_code(late) == 1
    chosen = hc.run_steps(
        hc.plan_steps("ci", tmp_path, "py", only="fp8"),
        "ci",
        tmp_path,
        60.0,
        FakeRunner(FakeClock(), tmp_path),
        FakeClock(),
    )
    assert hc.exit_code(chosen) == 0  # steps left out on purpose are no failure


def test_report_holds_stamp_statuses_files_and_skipped_rows(tmp_path: Path) -> None:
    clock = FakeClock()
    runner = FakeRunner(clock, tmp_path, codes={"notebooks": 1})
    done = hc.run_steps(
        hc.plan_steps("hopper", tmp_path, "py"), "hopper", tmp_path, 480.0, runner, clock
    )
    json_path, md_path = hc.write_report(tmp_path, "hopper", STAMP, done, 480.0)
    assert json_path.name == "hopper_check-hopper.json" and md_path.suffix == ".md"
    record = json.loads(json_path.read_text())
    assert record["environment"] == STAMP and record["ok"] is False
    steps = {s["name"]: s for s in record["steps"]}
    assert steps["notebooks"]["status"] == "failed" and steps["ladder"]["status"] == "ok"
    assert any(f.endswith(".json") for f in steps["fusion"]["files"])
    assert "fp8: te-fp8: Transformer Engine is not installed" in record["skipped_rows"]
    md = md_path.read_text()
    for text in (
        "NVIDIA H200",
        "580.159.04",
        "2.11.0+cu130",
        "3.6.0",
        "13.0",
        "2026-11-20",
        "| notebooks | failed |",
        "| precision | ok |",
        "NOT all steps passed",
        "Transformer Engine is not installed",
    ):
        assert text in md


def test_main_writes_report_bundle_and_exit_code(tmp_path: Path) -> None:
    results, tarball = tmp_path / "results", tmp_path / "out" / "bundle.tar.gz"
    clock = FakeClock()
    runner = FakeRunner(clock, results)
    argv = ["--preset", "hopper", "--results", str(results), "--bundle", str(tarball)]
    assert hc.main(argv, runner=runner, stamp=lambda preset: {**STAMP, "preset": preset}) == 0
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert "hopper_check-hopper.json" in names and "hopper_check-hopper.md" in names
    assert "precision__nvidia-h200__hopper__2026-11-20.json" in names and len(names) == 10
    failing = FakeRunner(FakeClock(), results, codes={"ladder": 2})
    assert hc.main(argv[:4] + ["--skip-notebooks"], runner=failing, stamp=lambda p: STAMP) == 1
    assert [c[0] for c in failing.calls] == ["precision", "fp8", "fusion", "ladder"]


def test_parse_args_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUTORIAL_PRESET", raising=False)
    args = hc.parse_args([])
    assert args.preset == "hopper" and args.budget_s == 480
    assert args.results == ROOT / "benchmarks" / "results"
    monkeypatch.setenv("TUTORIAL_PRESET", "ci")
    assert hc.parse_args([]).preset == "ci"
    with pytest.raises(SystemExit):
        hc.parse_args(["--only", "nothing"])


# scripts/device_wheels.py: the wheels that carry nbmake to the device machine.
dw_spec = importlib.util.spec_from_file_location(
    "device_wheels", ROOT / "scripts" / "device_wheels.py"
)
assert dw_spec is not None and dw_spec.loader is not None
dw = importlib.util.module_from_spec(dw_spec)
dw_spec.loader.exec_module(dw)


def _wheel(folder: Path, name: str, version: str, requires: Sequence[str]) -> Path:
    import zipfile

    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            f"{name}-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}",
        )
    return path


def test_device_wheels_closure_and_stale_versions(tmp_path: Path) -> None:
    a = _wheel(
        tmp_path,
        "nbmake",
        "1.5.5",
        [
            "nbclient>=0.6",
            "pytest>=6",
            "pywin32; sys_platform == 'win32'",
            "black; extra == 'dev'",
            "tomli; python_version < '3.11'",
        ],
    )
    assert dw.wheel_requirements(a) == ["nbclient", "pytest"]  # markers for CPython 3.12, Linux
    assert dw.unmet([a]) == {a.name: ["nbclient"]}  # pytest is in the image
    b = _wheel(tmp_path, "nbclient", "0.11.0", ["traitlets"])
    assert dw.unmet([a, b]) == {b.name: ["traitlets"]}
    assert dw.stale([a, b], {"nbmake": "1.5.5", "nbclient": "0.10.0"}) == [b]


def test_device_wheels_exclude_entry_added_once(tmp_path: Path) -> None:
    (tmp_path / ".git" / "info").mkdir(parents=True)
    (tmp_path / ".git" / "info" / "exclude").write_text("# git ls-files --others --exclude-from")
    dw.exclude_folder(tmp_path, ".whl")
    dw.exclude_folder(tmp_path, ".whl")
    lines = (tmp_path / ".git" / "info" / "exclude").read_text().splitlines()
    assert lines.count("/.whl/") == 1 and len(lines) == 2
