"""scripts/ensure_venv.py: the venv follows TORCH=cpu|system instead of being silently reused."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ensure_venv.py"
spec = importlib.util.spec_from_file_location("ensure_venv", SCRIPT)
ensure_venv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ensure_venv)


@pytest.fixture
def fake_venv(monkeypatch):
    """Record venv creations instead of running them (each writes a pyvenv.cfg like venv's)."""
    made = []

    def run(cmd, check):
        venv = Path(cmd[-1])
        venv.mkdir(parents=True)
        (venv / "bin").mkdir()
        (venv / "bin" / "python").touch()
        system = "--system-site-packages" in cmd
        (venv / "pyvenv.cfg").write_text(
            f"home = /usr/bin\ninclude-system-site-packages = {str(system).lower()}\n"
        )
        made.append(cmd)

    monkeypatch.setattr(ensure_venv.subprocess, "run", run)
    return made


def test_switching_mode_recreates_the_venv(tmp_path, fake_venv, capsys):
    venv = tmp_path / ".venv"
    assert ensure_venv.ensure_venv(venv, "cpu") == "created"
    (venv / "marker").touch()
    assert ensure_venv.ensure_venv(venv, "cpu") == "kept"
    assert (venv / "marker").exists()
    assert ensure_venv.ensure_venv(venv, "system") == "recreated"
    assert not (venv / "marker").exists()
    assert ensure_venv.sees_system_packages(venv) is True
    assert "made for TORCH=cpu; recreating it for TORCH=system" in capsys.readouterr().out
    assert ensure_venv.ensure_venv(venv, "cpu") == "recreated"
    assert ensure_venv.sees_system_packages(venv) is False
    assert [("--system-site-packages" in c) for c in fake_venv] == [False, True, False]


def test_reads_a_real_venv(tmp_path):
    import venv as stdlib_venv

    stdlib_venv.create(tmp_path / "v", system_site_packages=True, with_pip=False)
    assert ensure_venv.sees_system_packages(tmp_path / "v") is True
    assert ensure_venv.sees_system_packages(tmp_path / "missing") is None


def test_rejects_an_unknown_mode(tmp_path):
    with pytest.raises(ValueError, match="cpu"):
        ensure_venv.ensure_venv(tmp_path / "v", "cuda")
