"""Tests for the command line, ``python -m tutorial_lib {info,train}``, mostly run in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from cli_runner import ci_preset, run_main, train_argv  # noqa: F401 (the fixture)

from tutorial_lib.__main__ import main
from tutorial_lib.build import build_model
from tutorial_lib.checkpoint import load_checkpoint
from tutorial_lib.config import GPTConfig
from tutorial_lib.data import make_data
from tutorial_lib.parallel.mesh import ParallelDims
from tutorial_lib.train import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("ci_preset")


_run = run_main


# ---- info ----------------------------------------------------------------------------------


def test_info_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["info"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    for prefix in ("device:", "spec:", "preset:  ci", "FP8 GEMMs:", "Transformer Engine:"):
        assert any(line.startswith(prefix) for line in lines), (prefix, out)
    assert "fp32" in out and "bf16" in out  # the precision policies
    assert "matrix instructions:" in out and "torch kernels:" in out  # the CPU, described


def test_info_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["info", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert {"device", "preset", "fp8_gemms", "transformer_engine"} <= set(report)
    assert report["preset"] == "ci"
    assert report["cpu"]["torch_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(report["cpu"]["bf16_matrix"], bool)
    for key in ("fp8_gemms", "transformer_engine"):
        assert isinstance(report[key]["available"], bool) and report[key]["reason"]
    assert {"fp32", "tf32", "bf16", "fp16"} <= set(report["precision_policies"])


# ---- train and resume ----------------------------------------------------------------------


_train_args = train_argv


def test_train_then_resume(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code, stdout, err = _run(_train_args(out, text_file, 4), capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "metrics.json"]
    first = json.loads((out / "metrics.json").read_text())
    assert [r["step"] for r in first] == [0, 1, 2, 3]
    assert first[-1]["val_loss"] is not None  # validated at the end
    assert load_checkpoint(out / "checkpoint.pt")["step"] == 4
    assert "step 4: loss" in stdout

    code, stdout, err = _run(_train_args(out, text_file, 6, "--resume"), capsys)
    assert code == 0, err
    assert "resumed from" in stdout and "at step 4" in stdout
    second = json.loads((out / "metrics.json").read_text())
    assert [r["step"] for r in second] == list(range(6))
    assert second[:4] == first  # the first run's rows, untouched
    assert load_checkpoint(out / "checkpoint.pt")["step"] == 6


def _as_sharded_checkpoint(out: Path, data: Path) -> None:
    """Replace OUT/checkpoint.pt by the same state in the DCP form, OUT/checkpoint/ (what a
    sharded run writes), written from one process."""
    state = load_checkpoint(out / "checkpoint.pt")
    model_cfg = GPTConfig(**state["model_config"])
    trainer = Trainer(
        build_model(model_cfg), make_data(model_cfg.block_size, path=data, seed=0),
        TrainConfig(**state["train_config"]),
        device="cpu",
    )  # fmt: skip
    trainer.resume(out / "checkpoint.pt")
    with mock.patch.object(ParallelDims, "sharded", True):  # the DCP form, from one process
        trainer.save(out / "checkpoint")
    (out / "checkpoint.pt").unlink()


def test_sharded_checkpoints_resume_as_checkpoint_files_do(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--resume continues from OUT/checkpoint/ (DCP) as from OUT/checkpoint.pt, and takes the
    newer when both are there: bit for bit as a run that stopped and resumed at the same steps
    with checkpoint files."""
    files, out = tmp_path / "files", tmp_path / "run"
    for steps, extra in ((3, ()), (4, ("--resume",)), (5, ("--resume",))):
        assert _run(_train_args(files, text_file, steps, *extra), capsys)[0] == 0
    assert _run(_train_args(out, text_file, 3), capsys)[0] == 0
    _as_sharded_checkpoint(out, text_file)
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["run.pt", "shards"]
    code, stdout, err = _run(_train_args(out, text_file, 4, "--resume"), capsys)
    assert code == 0, err
    assert f"resumed from {out / 'checkpoint'} at step 3" in stdout
    code, stdout, err = _run(_train_args(out, text_file, 5, "--resume"), capsys)
    assert code == 0, err
    assert f"resumed from {out / 'checkpoint.pt'} at step 4" in stdout  # the newer one
    assert load_checkpoint(out / "checkpoint.pt")["step"] == 5
    rows = [json.loads((d / "metrics.json").read_text()) for d in (out, files)]
    assert [[r["loss"] for r in row] for row in rows] == [[r["loss"] for r in rows[1]]] * 2
    assert len(rows[0]) == 5


def test_resume_from_a_corrupt_checkpoint_says_which_file_and_what_to_do(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"garbage\n")
    code, _, err = _run(_train_args(out, text_file, 2, "--resume"), capsys)
    assert code == 1
    assert f"error: {out / 'checkpoint.pt'} is not a readable checkpoint" in err
    assert "--force" in err and "invalid literal" not in err
    assert (out / "checkpoint.pt").read_bytes() == b"garbage\n"  # left for the user to inspect


def test_resume_without_checkpoint_starts_fresh(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "fresh"
    code, stdout, err = _run(_train_args(out, text_file, 2, "--resume"), capsys)
    assert code == 0, err
    assert "resumed" not in stdout
    assert len(json.loads((out / "metrics.json").read_text())) == 2


# ---- bad arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["train", "--steps", "0", "--out", "x"], 2, "expected a positive integer, got 0"),
        (["train", "--batch-size", "two", "--out", "x"], 2, "positive integer, got 'two'"),
        (["train", "--steps", "3"], 2, "--out"),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
        ([], 2, "required"),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: list[str], code: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == code
    err = capsys.readouterr().err
    assert message in err and "usage:" in err


def test_unknown_precision_fails_cleanly(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _train_args(tmp_path / "p", text_file, 2, "--precision", "nope")
    code, _, err = _run(argv, capsys)
    assert code != 0
    assert "Unknown precision policy 'nope'" in err and "bf16" in err
    assert not (tmp_path / "p" / "checkpoint.pt").exists()


def test_missing_data_fails_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(_train_args(tmp_path / "d", Path("/nonexistent"), 2), capsys)
    assert code != 0
    assert err.startswith("error:") and "/nonexistent" in err and "does not exist" in err


def test_negative_checkpoint_every_fails_cleanly(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _train_args(tmp_path / "c", text_file, 2, "--checkpoint-every", "-1")
    code, _, err = _run(argv, capsys)
    assert code != 0 and "checkpoint_every" in err


# ---- as a program --------------------------------------------------------------------------


def test_module_help_in_a_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tutorial_lib", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "info" in proc.stdout and "train" in proc.stdout
    assert proc.stdout.startswith("usage: python -m tutorial_lib")
