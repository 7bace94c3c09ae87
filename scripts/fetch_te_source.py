#!/usr/bin/env python3
"""Fetch Transformer Engine's Python source, for ``tests/test_te_contract.py`` to read with ``ast``.

Usage: ``python scripts/fetch_te_source.py [--cache-dir .cache/te] [--force]``
(``make setup`` runs it).

On PyPI, ``transformer-engine`` is a pure-Python wheel (``py3-none-any``) that holds the whole
``transformer_engine`` Python package, ``pytorch/`` and ``common/recipe/`` included; the compiled
parts live in other distributions (``transformer_engine_cu12``/``_cu13``, and the
``transformer_engine_torch`` sdist). So one ``pip download --no-deps`` per pinned version gives
the API source without CUDA, and nothing here is ever imported.

For each version in ``TE_VERSIONS`` the wheel is checked against its pinned sha256, its ``.py``
files are unpacked into ``CACHE_DIR/<version>/`` and a ``.complete`` stamp is written last. A
version with a stamp is skipped, so after the first run the script works offline. With
``TUTORIAL_OFFLINE=1`` it downloads nothing and exits 0 (the contract test then skips).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = ROOT / ".cache" / "te"
STAMP_NAME = ".complete"
OFFLINE_ENV = "TUTORIAL_OFFLINE"

# version -> sha256 of transformer_engine-<version>-py3-none-any.whl on PyPI.
# 2.9.0: the oldest release with the `autocast`/`recipe=` names, the floor in pyproject's `te`
# extra; 2.20.2: the newest 2.x when pinned. The contract test checks our backend against both.
TE_VERSIONS: dict[str, str] = {
    "2.9.0": "953147ed4c490e54c9884bb0d876a1341f05c5c5b7d304bf61f4740f6faee5af",
    "2.20.2": "7dcfad943a1a55b2612db9a0e43697fe98c70f4c42ec391ba3a0f872f6ce2094",
}
# Files whose absence means the wheel does not carry the PyTorch API source after all.
REQUIRED_FILES = (
    "transformer_engine/pytorch/__init__.py",
    "transformer_engine/pytorch/module/linear.py",
    "transformer_engine/pytorch/module/layernorm.py",
    "transformer_engine/common/recipe/__init__.py",
)


def source_dir(version: str, cache_dir: Path = CACHE_DIR) -> Path:
    """Where the unpacked source of ``version`` lives (``<dir>/transformer_engine/...``)."""
    return cache_dir / version


def is_complete(version: str, cache_dir: Path = CACHE_DIR) -> bool:
    return (source_dir(version, cache_dir) / STAMP_NAME).is_file()


def _download(version: str, dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(dest),
        f"transformer-engine=={version}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(
            f"pip download of transformer-engine=={version} failed (network?):\n{result.stderr}\n"
            f"Retry with network access, or set {OFFLINE_ENV}=1 to skip the TE contract test."
        )
    wheels = sorted(dest.glob(f"transformer_engine-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"pip saved no transformer_engine-{version} wheel in {dest}.")
    wheel = wheels[0]
    if not wheel.name.endswith("-py3-none-any.whl"):
        raise SystemExit(f"{wheel.name} is not a pure-Python wheel; the pins need updating.")
    return wheel


def _check_sha256(wheel: Path, expected: str) -> None:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != expected:
        raise SystemExit(f"{wheel.name}: sha256 {digest} differs from the pinned {expected}.")


def _unpack(wheel: Path, target: Path) -> int:
    """Extract the ``transformer_engine/**.py`` files; returns how many."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        missing = [f for f in REQUIRED_FILES if f not in names]
        if missing:
            raise SystemExit(f"{wheel.name} lacks {missing}: it no longer carries the API source.")
        wanted = [n for n in names if n.startswith("transformer_engine/") and n.endswith(".py")]
        for name in wanted:
            path = target / name
            if not path.resolve().is_relative_to(target.resolve()):
                raise SystemExit(f"{wheel.name}: refusing to extract {name} outside {target}.")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(zf.read(name))
    return len(wanted)


def fetch(version: str, sha256: str, cache_dir: Path = CACHE_DIR, force: bool = False) -> Path:
    """Download, verify and unpack one version (skipped if already complete)."""
    target = source_dir(version, cache_dir)
    if is_complete(version, cache_dir) and not force:
        print(f"transformer-engine {version}: cached in {target}")
        return target
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download(version, Path(tmp))
        _check_sha256(wheel, sha256)
        target.mkdir(parents=True)
        count = _unpack(wheel, target)
        (target / STAMP_NAME).write_text(f"{wheel.name}\nsha256 {sha256}\n{count} files\n")
    print(f"transformer-engine {version}: {count} source files in {target}")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--force", action="store_true", help="download again even if cached")
    args = parser.parse_args(argv)
    if os.environ.get(OFFLINE_ENV) == "1":
        print(f"{OFFLINE_ENV}=1: not fetching Transformer Engine source.")
        return 0
    for version, sha256 in TE_VERSIONS.items():
        fetch(version, sha256, args.cache_dir, args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
