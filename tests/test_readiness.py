"""Tests for the workshop readiness check (``tutorial_lib.readiness`` and ``info --strict``)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tutorial_lib import machine_probe, readiness
from tutorial_lib.__main__ import main
from tutorial_lib.machine_probe import GPU, Machine, gather_machine
from tutorial_lib.readiness import (
    MIN_DISK_BYTES,
    MIN_RAM_BYTES,
    MISSING,
    OK,
    OPTIONAL,
    SETUP_FIX,
    check_readiness,
    evaluate,
    format_readiness,
)

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
A100 = GPU("NVIDIA A100-SXM4-80GB", (8, 0))
H100 = GPU("NVIDIA H100 80GB HBM3", (9, 0))
L40S = GPU("NVIDIA L40S", (8, 9))
PACKAGES = {
    "jupyterlab": "4.2.0",
    "notebook": None,
    "ipykernel": "6.29.0",
    "ipywidgets": "8.1.0",
    "matplotlib": "3.8.0",
    "tqdm": "4.66.0",
    "triton": "3.2.0",
}


@pytest.fixture(autouse=True)
def no_preset_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the checks auto-select the preset, as on an attendee's machine."""
    monkeypatch.delenv("TUTORIAL_PRESET", raising=False)


def machine(**overrides: object) -> Machine:
    """A ready Linux laptop without a GPU; ``overrides`` change single facts."""
    base = Machine(
        python=(3, 11, 7),
        platform="linux",
        torch_version="2.13.0+cpu",
        torch_cuda=None,
        packages=dict(PACKAGES),
        gpu=None,
        nvidia_smi=False,
        cxx="/usr/bin/g++",
        disk_free=50 * GiB,
        ram_total=16 * GiB,
        preset_env=None,
        te=(False, "transformer_engine.pytorch does not import"),
        cwd="/home/me/book",
    )
    return dataclasses.replace(base, **overrides)


def row(report: readiness.Readiness, name: str) -> readiness.Check:
    (found,) = [c for c in report.checks if c.name == name]
    return found


def status_of(report: readiness.Readiness) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


# ---- this machine ---------------------------------------------------------------------------


@pytest.fixture
def ample_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    """RAM and free disk vary from machine to machine; the software checks must not."""
    monkeypatch.setattr(machine_probe, "_ram_total", lambda: 2 * MIN_RAM_BYTES)
    monkeypatch.setattr(machine_probe, "_disk_free", lambda path: 2 * MIN_DISK_BYTES)


def test_this_machine_is_ready(ample_resources: None) -> None:
    """The project's own environment (where these tests run) has everything the book needs."""
    m = gather_machine()
    report = check_readiness()
    assert report.ready, format_readiness(report)
    for name in ("Python", "torch", "notebook stack", "Triton", "C++ compiler", "preset", "GPU"):
        assert row(report, name).status == OK, format_readiness(report)
    if m.gpu is None:  # the development machines: a CPU
        assert report.preset == "ci"
        assert row(report, "GPU").detail == "none: ci preset on CPU (fine for the workshop)"
        assert "interpreter" in row(report, "Triton").detail
        assert row(report, "Transformer Engine").status == OPTIONAL
    assert report.verdict == f"READY for the workshop (preset {report.preset})"


def test_every_check_has_a_row_and_problems_have_fixes() -> None:
    names = [c.name for c in check_readiness().checks]
    assert names == [
        "Python",
        "torch",
        "notebook stack",
        "Triton",
        "C++ compiler",
        "disk",
        "RAM",
        "preset",
        "GPU",
        "Transformer Engine",
        "book at hopper",
    ]
    bad = machine(
        python=(3, 9, 18),
        torch_version=None,
        packages={},
        cxx=None,
        disk_free=GiB,
        ram_total=4 * GiB,
        preset_env="laptop",
    )
    report = evaluate(bad)
    assert not report.ready
    for c in report.checks:
        assert c.status in (OK, MISSING, OPTIONAL)
        if c.status == MISSING:
            assert c.fix, c


# ---- simulated problems, through the probes --------------------------------------------------


def test_missing_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    absent = {"ipywidgets", "triton", "jupyterlab", "notebook"}
    real = machine_probe._package_version
    monkeypatch.setattr(
        machine_probe, "_package_version", lambda name: None if name in absent else real(name)
    )
    monkeypatch.setattr(machine_probe.sys, "platform", "linux")
    report = check_readiness()
    assert not report.ready
    stack = row(report, "notebook stack")
    assert stack.status == MISSING and stack.fix == SETUP_FIX
    assert stack.detail == "missing: jupyterlab (or notebook), ipywidgets"
    assert row(report, "Triton").status == MISSING and row(report, "Triton").fix == SETUP_FIX
    # One clause for the shared fix, naming both checks.
    assert report.verdict == f"NOT READY: notebook stack, Triton: {SETUP_FIX}"
    assert "pip install -e '.[dev,book]'" in report.verdict and "make setup" in report.verdict


def test_classic_notebook_is_enough() -> None:
    packages = {**PACKAGES, "jupyterlab": None, "notebook": "7.2.0"}
    report = evaluate(machine(packages=packages))
    assert report.ready
    assert row(report, "notebook stack").detail.startswith("notebook 7.2.0, ipykernel")


def test_low_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_probe, "_ram_total", lambda: 4 * GiB)
    report = check_readiness()
    ram = row(report, "RAM")
    assert ram.status == MISSING
    assert ram.detail == "4.0 GiB total; need at least 7 GiB"
    assert not report.ready
    assert report.verdict.startswith("NOT READY: RAM: use a machine with 8 GB or more")


def test_ram_without_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now raises ImportError
    total = machine_probe._ram_total()
    assert total is not None and total > 0


def test_low_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_probe, "_disk_free", lambda path: GiB // 2)
    report = check_readiness()
    disk = row(report, "disk")
    assert disk.status == MISSING and disk.detail.startswith("0.5 GiB free in ")
    assert "free up space" in disk.fix and not report.ready


def test_sm80_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_probe, "_torch", lambda: ("2.7.1+cu126", "12.6", A100))
    monkeypatch.setattr(machine_probe, "_te", lambda: (False, "no module named transformer_engine"))
    report = check_readiness()
    assert report.ready, format_readiness(report)
    assert report.preset == "ci"
    assert row(report, "preset").detail == (
        "ci (auto: NVIDIA A100-SXM4-80GB is sm_80; hopper is picked on sm_90 only)"
    )
    gpu = row(report, "GPU")
    assert gpu.status == OK and "sm_80" in gpu.detail and "no FP8 speed" in gpu.detail
    assert row(report, "torch").detail == "2.7.1+cu126 (CUDA 12.6 build)"
    if row(report, "Triton").status == OK:
        assert "compile for the GPU (sm_80)" in row(report, "Triton").detail
    te = row(report, "Transformer Engine")
    assert te.status == OPTIONAL and "sm_89+" in te.detail
    assert report.verdict == "READY for the workshop (preset ci)"


def test_hopper_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_probe, "_torch", lambda: ("2.7.1+cu128", "12.8", H100))
    monkeypatch.setattr(machine_probe, "_te", lambda: (False, "no module named transformer_engine"))
    report = check_readiness()
    assert report.preset == "hopper"
    assert "hopper ready" in row(report, "GPU").detail
    te = row(report, "Transformer Engine")
    assert te.status == OPTIONAL and "te_install" in te.fix
    assert report.ready and report.verdict == "READY for the workshop (preset hopper)"
    with_te = evaluate(machine(gpu=H100, torch_cuda="12.8", te=(True, "imports")))
    assert row(with_te, "Transformer Engine").status == OK


def test_ada_gpu_has_fp8_but_ci_preset() -> None:
    report = evaluate(machine(gpu=L40S, torch_cuda="12.8"))
    assert report.preset == "ci" and "FP8 tensor cores" in row(report, "GPU").detail


def test_cpu_torch_on_a_gpu_machine_is_optional() -> None:
    report = evaluate(machine(nvidia_smi=True))
    gpu = row(report, "GPU")
    assert gpu.status == OPTIONAL and "TORCH=system" in gpu.fix
    assert report.ready


# ---- preset, Python, torch, Triton, compiler -------------------------------------------------


def test_preset_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUTORIAL_PRESET", "CI ")
    report = check_readiness()
    assert report.preset == "ci" and "from TUTORIAL_PRESET" in row(report, "preset").detail


def test_hopper_preset_on_a_cpu_is_not_ready() -> None:
    report = evaluate(machine(preset_env="hopper"))
    assert row(report, "preset").status == MISSING
    assert report.verdict == (
        "NOT READY: preset: unset TUTORIAL_PRESET (or export TUTORIAL_PRESET=ci)"
    )
    assert evaluate(machine(preset_env="hopper", gpu=A100, torch_cuda="12.6")).ready


def test_unknown_preset() -> None:
    report = evaluate(machine(preset_env="laptop"))
    check = row(report, "preset")
    assert check.status == MISSING and "one of ci, hopper" in check.fix
    assert report.preset == "ci"


def test_old_python_and_torch() -> None:
    report = evaluate(machine(python=(3, 9, 18), torch_version="2.4.1+cpu"))
    assert row(report, "Python").status == MISSING
    assert "3.10 or newer" in row(report, "Python").fix
    assert row(report, "torch").status == MISSING
    assert row(report, "torch").detail.endswith("is older than 2.6")
    assert evaluate(machine(torch_version=None)).verdict == f"NOT READY: torch: {SETUP_FIX}"


def test_triton_on_macos_is_optional() -> None:
    report = evaluate(machine(platform="darwin", packages={**PACKAGES, "triton": None}))
    triton = row(report, "Triton")
    assert triton.status == OPTIONAL and "chapter 7" in triton.detail
    assert report.ready


def test_no_compiler() -> None:
    report = evaluate(machine(cxx=None))
    assert row(report, "C++ compiler").status == MISSING
    assert "apt-get install g++" in report.verdict


def test_format_shows_fixes_for_problems_only() -> None:
    text = format_readiness(evaluate(machine(ram_total=4 * GiB)))
    lines = text.splitlines()
    assert lines[0] == "ready?"
    assert lines[-1].startswith("NOT READY: RAM:")
    fix_lines = [line for line in lines if line.strip().startswith("fix:")]
    assert len(fix_lines) == 1 and "8 GB" in fix_lines[0]
    assert any(line.split()[:2] == ["missing", "RAM:"] for line in lines)


# ---- the command line ------------------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    out, _ = capsys.readouterr()
    return code, out


def test_cli_ready(ample_resources: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(["info"], capsys)
    assert code == 0
    assert "\nready?\n" in out and out.rstrip().splitlines()[-1].startswith("READY for the")
    assert out.startswith("tutorial_lib ")  # the existing lines come first
    assert _run(["info", "--strict"], capsys)[0] == 0


def test_cli_not_ready_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(machine_probe, "_ram_total", lambda: 2 * GiB)
    code, out = _run(["info"], capsys)
    assert code == 0 and out.rstrip().splitlines()[-1].startswith("NOT READY: RAM:")
    code, out = _run(["info", "--strict"], capsys)
    assert code == 1 and "NOT READY" in out
    code, out = _run(["info", "--json", "--strict"], capsys)
    assert code == 1
    ready = json.loads(out)["readiness"]
    assert ready["ready"] is False and ready["verdict"].startswith("NOT READY")
    assert {"name", "status", "detail", "fix"} == set(ready["checks"][0])


def test_cli_bad_preset_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TUTORIAL_PRESET", "laptop")
    code, out = _run(["info", "--strict"], capsys)
    assert code == 1
    assert "preset:  none (Unknown preset 'laptop'" in out
    assert "NOT READY: preset: unset TUTORIAL_PRESET" in out


def test_cli_strict_in_a_subprocess() -> None:
    """The real entry point passes the status to the shell (whatever this machine's RAM/disk)."""
    report = check_readiness()
    env_cmd = [sys.executable, "-m", "tutorial_lib", "info", "--strict"]
    done = subprocess.run(env_cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == (0 if report.ready else 1), done.stdout + done.stderr
    assert done.stdout.rstrip().splitlines()[-1] == report.verdict
