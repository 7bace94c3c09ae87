"""Create the project's virtual environment, or recreate it when the torch mode changed.

``make`` calls this before installing anything. ``TORCH=system`` needs a venv that sees the
interpreter's site-packages (where the user's CUDA torch lives); ``TORCH=cpu`` needs one that
does not. A venv made for the other mode is removed and made again, instead of silently reusing
a torch that is not the one asked for.

    python scripts/ensure_venv.py VENV_DIR cpu|system
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

MODES = ("cpu", "system")


def sees_system_packages(venv: Path) -> bool | None:
    """What ``venv/pyvenv.cfg`` says, or None if there is no readable venv there."""
    cfg = venv / "pyvenv.cfg"
    if not cfg.is_file():
        return None
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "include-system-site-packages":
            return value.strip().lower() == "true"
    return False  # venv's default


def ensure_venv(venv: Path, mode: str, python: str = sys.executable) -> str:
    """Make ``venv`` fit ``mode``; returns what was done: 'kept', 'created' or 'recreated'."""
    if mode not in MODES:
        raise ValueError(f"torch mode must be one of {MODES}, got {mode!r}.")
    want = mode == "system"
    have = sees_system_packages(venv)
    if have == want and (venv / "bin" / "python").exists():
        return "kept"
    action = "created"
    if venv.exists():
        action = "recreated"
        print(
            f"{venv} was made for TORCH={'system' if have else 'cpu'}; "
            f"recreating it for TORCH={mode}",
            flush=True,
        )
        shutil.rmtree(venv)
    cmd = [python, "-m", "venv", *(["--system-site-packages"] if want else []), str(venv)]
    subprocess.run(cmd, check=True)
    return action


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("venv", type=Path)
    parser.add_argument("mode", choices=MODES)
    args = parser.parse_args(argv)
    ensure_venv(args.venv, args.mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
