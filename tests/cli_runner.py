"""``python -m tutorial_lib`` run in the test's process: what the CLI tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tutorial_lib.__main__ import main


@pytest.fixture
def ci_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands' default preset: ``ci`` (``pytestmark = usefixtures("ci_preset")``)."""
    monkeypatch.setenv("TUTORIAL_PRESET", "ci")


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``main(argv)``'s exit status (argparse's SystemExit included), stdout and stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def train_argv(out: Path, data: Path, steps: int, *extra: str) -> list[str]:
    """``train`` at the ``ci`` preset on the CPU: ``steps`` steps of batch 2 on ``data``."""
    return [
        "train", "--preset", "ci", "--steps", str(steps), "--batch-size", "2", "--data",
        str(data), "--out", str(out), "--device", "cpu", "--no-progress", *extra,
    ]  # fmt: skip
