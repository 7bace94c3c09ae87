"""Tests for the recorded-results format: environment stamps, write/load, labels, tables."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tutorial_lib.bench import (
    environment_stamp,
    latest_hopper_results,
    load_results,
    markdown_table,
    results_label,
    write_results,
)
from tutorial_lib.bench import results as results_mod
from tutorial_lib.hardware import describe_device

STAMP_KEYS = {
    "date",
    "device",
    "device_type",
    "device_summary",
    "compute_capability",
    "torch",
    "cuda",
    "driver",
    "triton",
    "python",
    "platform",
    "preset",
}


def _env(device: str, date: str, cuda: str | None = "12.8") -> dict[str, Any]:
    """A fixed environment stamp, as if recorded on ``device`` at ``date``."""
    return {
        "date": date,
        "device": device,
        "device_type": "cuda" if cuda else "cpu",
        "device_summary": f"{device} (summary)",
        "compute_capability": "9.0" if cuda else None,
        "torch": "2.7.0",
        "cuda": cuda,
        "driver": None,
        "triton": None,
        "python": "3.11.9",
        "platform": "Linux",
        "preset": "hopper" if cuda else "ci",
    }


H100 = _env("NVIDIA H100 80GB HBM3", "2025-01-02T10:00:00+00:00")
H200_OLD = _env("NVIDIA H200", "2025-03-04T09:00:00+00:00")
H200_NEW = _env("NVIDIA H200", "2025-03-05T08:30:00+00:00")
CPU = _env("AMD EPYC 7B13", "2025-06-07T12:00:00+00:00", cuda=None)

# ---- environment_stamp ---------------------------------------------------------------------


def test_environment_stamp_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUTORIAL_PRESET", "hopper")
    stamp = environment_stamp("cpu")
    assert set(stamp) == STAMP_KEYS
    date = dt.datetime.fromisoformat(stamp["date"])
    assert date.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.timezone.utc) - date).total_seconds()) < 60
    info = describe_device("cpu")
    assert stamp["device"] == info.name and stamp["device_summary"] == info.summary()
    assert stamp["device_type"] == "cpu" and stamp["compute_capability"] is None
    assert stamp["torch"] == torch.__version__ and stamp["cuda"] == torch.version.cuda
    assert stamp["preset"] == "hopper"
    json.dumps(stamp)  # plain JSON types only


def test_environment_stamp_survives_a_bad_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUTORIAL_PRESET", "no-such-preset")
    assert environment_stamp("cpu")["preset"] is None


def test_driver_version_parses_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert cmd[0] == "nvidia-smi" and kwargs["timeout"] == 5
        return subprocess.CompletedProcess(cmd, 0, stdout="550.54.15\n550.54.15\n", stderr="")

    monkeypatch.setattr(results_mod.subprocess, "run", fake_run)
    assert results_mod._driver_version() == "550.54.15"


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError("nvidia-smi"),
        subprocess.TimeoutExpired("nvidia-smi", 5),
        subprocess.CalledProcessError(9, "nvidia-smi"),
    ],
)
def test_driver_version_none_without_nvidia_smi(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def fake_run(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(results_mod.subprocess, "run", fake_run)
    assert results_mod._driver_version() is None


# ---- write_results / load_results ----------------------------------------------------------


def _write_all(out: Path, envs: list[dict[str, Any]], name: str = "precision") -> list[Path]:
    return [
        write_results(name, [{"policy": "bf16", "i": i}], out, {"i": i}, environment=env)
        for i, env in enumerate(envs)
    ]


def test_write_results_file_names_and_content(tmp_path: Path) -> None:
    rows = [{"policy": "fp32", "step_time_ms": 12.5}, {"policy": "fp16", "skipped": "no GPU"}]
    path = write_results(
        "precision", rows, tmp_path / "new", {"preset": "ci"}, environment=H200_NEW
    )
    assert path == tmp_path / "new" / "precision__nvidia-h200__hopper__2025-03-05.json"
    record = json.loads(path.read_text())
    assert record == {
        "benchmark": "precision",
        "environment": H200_NEW,
        "meta": {"preset": "ci"},
        "rows": rows,
    }
    assert path.with_suffix(".md").is_file()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.stem + ".md"]


def test_write_results_stamps_this_machine_by_default(tmp_path: Path) -> None:
    path = write_results("demo", [{"x": 1}], tmp_path)
    record = json.loads(path.read_text())
    assert set(record["environment"]) == STAMP_KEYS
    assert record["meta"] is None
    assert path.name.endswith(f"__{dt.datetime.now(dt.timezone.utc).date().isoformat()}.json")


@pytest.mark.parametrize("name", ["", "a b", "x/y", "two__parts"])
def test_write_results_rejects_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        write_results(name, [], tmp_path, environment=CPU)


def test_round_trip_newest_first(tmp_path: Path) -> None:
    _write_all(tmp_path, [H200_OLD, CPU, H100, H200_NEW])
    records = load_results("precision", tmp_path)
    assert [r["environment"]["date"] for r in records] == [
        CPU["date"],
        H200_NEW["date"],
        H200_OLD["date"],
        H100["date"],
    ]
    assert records[1]["rows"] == [{"policy": "bf16", "i": 3}] and records[1]["meta"] == {"i": 3}


def test_load_results_device_filter(tmp_path: Path) -> None:
    _write_all(tmp_path, [H200_OLD, CPU, H100, H200_NEW])
    h200 = load_results("precision", tmp_path, device_contains="h200")  # case-insensitive
    assert [r["environment"]["date"] for r in h200] == [H200_NEW["date"], H200_OLD["date"]]
    assert [r["environment"]["device"] for r in load_results("precision", tmp_path, "H100")] == [
        H100["device"]
    ]
    assert load_results("precision", tmp_path, device_contains="B200") == []


def test_load_results_keeps_to_its_benchmark(tmp_path: Path) -> None:
    _write_all(tmp_path, [H100], name="precision")
    _write_all(tmp_path, [H200_NEW], name="precision-fp8")
    _write_all(tmp_path, [CPU], name="attention")
    impostor = tmp_path / "precision__x__2030-01-01.json"  # right file name, wrong benchmark
    impostor.write_text(json.dumps({"benchmark": "other", "environment": H200_NEW, "rows": []}))
    assert [r["environment"]["device"] for r in load_results("precision", tmp_path)] == [
        H100["device"]
    ]
    assert load_results("precision", tmp_path / "missing") == []


def test_same_device_same_day_replaces(tmp_path: Path) -> None:
    later = {**H200_NEW, "date": "2025-03-05T23:59:00+00:00"}
    a, b = _write_all(tmp_path, [H200_NEW, later])
    assert a == b
    assert [r["environment"]["date"] for r in load_results("precision", tmp_path)] == [
        later["date"]
    ]


def test_latest_hopper_results(tmp_path: Path) -> None:
    _write_all(tmp_path, [H100, H200_OLD, H200_NEW, CPU])  # the CPU run is the newest
    latest = latest_hopper_results("precision", tmp_path)
    assert latest is not None and latest["environment"] == H200_NEW


def test_latest_hopper_results_none_with_only_cpu_files(tmp_path: Path) -> None:
    _write_all(tmp_path, [CPU, {**CPU, "date": "2025-06-08T00:00:00+00:00"}])
    assert len(load_results("precision", tmp_path)) == 2
    assert latest_hopper_results("precision", tmp_path) is None
    assert latest_hopper_results("precision", tmp_path / "nothing-here") is None


def test_latest_hopper_results_ignores_other_gpus(tmp_path: Path) -> None:
    _write_all(tmp_path, [_env("NVIDIA A100-SXM4-80GB", "2025-09-01T00:00:00+00:00"), H100])
    latest = latest_hopper_results("precision", tmp_path)
    assert latest is not None and latest["environment"]["device"] == H100["device"]


# ---- labels and tables ---------------------------------------------------------------------


def test_results_label() -> None:
    assert results_label({"environment": H200_NEW}) == (
        "measured on NVIDIA H200 on 2025-03-05, preset hopper (torch 2.7.0, CUDA 12.8)"
    )
    assert results_label({"environment": CPU}).endswith("(torch 2.7.0, CUDA none)")


def test_markdown_file_has_every_row(tmp_path: Path) -> None:
    rows = [
        {"policy": "fp32", "step_time_ms": 191.23456, "mfu": None},
        {"policy": "fp16", "skipped": "needs CUDA | a GPU"},
        {"policy": "bf16", "step_time_ms": 1337.0, "tokens_per_s": 1531.9, "mfu": None},
    ]
    path = write_results("precision", rows, tmp_path, environment=H100)
    text = path.with_suffix(".md").read_text()
    assert results_label({"environment": H100}) in text and H100["device_summary"] in text
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    assert header == ["policy", "step_time_ms", "mfu", "skipped", "tokens_per_s"]
    assert len(lines) == 2 + len(rows)
    assert lines[2] == "| fp32 | 191.2 | n/a |  |  |"
    assert lines[3] == "| fp16 |  |  | needs CUDA \\| a GPU |  |"
    assert lines[4] == "| bf16 | 1337 | n/a |  | 1532 |"


def test_markdown_table_without_rows() -> None:
    assert markdown_table([]) == "(no rows)"


def test_a_ci_run_on_hopper_is_not_a_hopper_result(tmp_path: Path) -> None:
    """A ci-preset run on an H200 keeps its own file and is never shown as the hopper result."""
    hopper = {**H200_NEW, "preset": "hopper"}
    ci = {**H200_NEW, "preset": "ci", "date": "2025-03-06T00:00:00+00:00"}
    write_results("precision", [{"policy": "bf16"}], tmp_path, environment=hopper)
    write_results("precision", [{"policy": "fp32"}], tmp_path, environment=ci)
    assert len(list(tmp_path.glob("precision__*.json"))) == 2
    rec = latest_hopper_results("precision", tmp_path)
    assert rec is not None and rec["rows"] == [{"policy": "bf16"}]
    assert "preset hopper" in results_label(rec)


def test_default_results_dir_does_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    from tutorial_lib.bench import results

    repo = Path(results.__file__).resolve().parents[2]
    monkeypatch.delenv(results.RESULTS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # as a notebook running in book/chapters would
    assert results.default_results_dir() == repo / "benchmarks" / "results"
    assert results.DEFAULT_DIR.is_absolute()
    monkeypatch.setenv(results.RESULTS_ENV, str(tmp_path / "elsewhere"))
    assert results.default_results_dir() == tmp_path / "elsewhere"
