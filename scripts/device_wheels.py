#!/usr/bin/env python3
"""Download the wheels the H200 device machine lacks for ``scripts/hopper_check.py`` (issue 9).

    .venv/bin/python scripts/device_wheels.py [--dest .whl] [--max-mib 40]

The device image (Python 3.12, torch, Triton, matplotlib, numpy, tqdm, pytest, pytest-xdist,
psutil, ...) has no Jupyter: nbmake and the kernel it starts need the packages in ``NEEDED``.
This fetches each, with no dependencies, as a CPython 3.12 manylinux x86-64 wheel into
``--dest`` (``pip download --only-binary=:all:``), pinned to the version this interpreter has
installed (run it with the project's ``.venv``), so the device executes the notebooks with the
same Jupyter stack as ``make test``. It then checks that every requirement of every wheel
(markers evaluated for CPython 3.12 on Linux, extras left out) is a downloaded wheel or in
``IMAGE``, prints the total size and fails above ``--max-mib``. ``/.whl/`` goes into
``.git/info/exclude`` (not ``.gitignore``): the folder travels only when a device run
``carry``-s it. ``tutorial_lib`` itself needs nothing more there: its dependencies (torch, numpy,
tqdm, matplotlib, triton) are all in the image, and the repository root goes on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]

# nbmake's dependency closure (and ipywidgets, which chapters 3-5 use), minus the image's.
NEEDED = (
    "nbmake",
    "nbclient",
    "nbformat",
    "fastjsonschema",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "ipykernel",
    "ipython",
    "ipython-pygments-lexers",
    "jedi",
    "parso",
    "pexpect",
    "ptyprocess",
    "prompt-toolkit",
    "wcwidth",
    "stack-data",
    "asttokens",
    "executing",
    "pure-eval",
    "traitlets",
    "comm",
    "debugpy",
    "matplotlib-inline",
    "jupyter-client",
    "jupyter-core",
    "platformdirs",
    "pyzmq",
    "tornado",
    "nest-asyncio2",
    "ipywidgets",
    "widgetsnbextension",
    "jupyterlab-widgets",
)
# Packages the offline H200 image (Python 3.12, CUDA torch) already has that the wheels above
# require, as listed on 2026-11-17. Carry one of these only for another version.
IMAGE = frozenset(
    {
        "attrs",
        "packaging",
        "psutil",
        "pygments",
        "pytest",
        "python-dateutil",
        "six",
        "typing-extensions",
        "pytest-xdist",
        "execnet",
        "pluggy",
        "iniconfig",
        "tqdm",
        "matplotlib",
        "numpy",
        "torch",
        "triton",
        "setuptools",
        "jinja2",
        "markupsafe",
        "pyyaml",
    }
)
# pip matches manylinux_2_N exactly: name every N the wheels above use.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
TARGET_ENV = {
    **default_environment(),
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "os_name": "posix",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "extra": "",
}


def pinned_versions(names: Iterable[str]) -> dict[str, str]:
    """``{name: version}`` as installed for this interpreter; exits naming any not installed."""
    pins, missing = {}, []
    for name in names:
        try:
            pins[name] = md.version(name)
        except md.PackageNotFoundError:
            missing.append(name)
    if missing:
        sys.exit(f"not installed here, so no version to pin: {', '.join(missing)}")
    return pins


def download(name: str, version: str, dest: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        "--dest",
        str(dest),
        f"{name}=={version}",
    ]
    for platform in PLATFORMS:
        cmd[-1:-1] = ["--platform", platform]
    subprocess.run(cmd, check=True)


def wheel_requirements(wheel: Path) -> list[str]:
    """The canonical names ``wheel`` requires on CPython 3.12 / Linux, without extras."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        headers = Parser().parsestr(zf.read(meta).decode("utf-8"))
    names = []
    for text in headers.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(TARGET_ENV):
            names.append(canonicalize_name(req.name))
    return names


def unmet(wheels: Sequence[Path], image: Iterable[str] = IMAGE) -> dict[str, list[str]]:
    """``{wheel file: [requirements neither downloaded nor in the image]}``, only where some."""
    have = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels}
    have |= {canonicalize_name(n) for n in image}
    gaps = {w.name: sorted(set(wheel_requirements(w)) - have) for w in wheels}
    return {name: missing for name, missing in gaps.items() if missing}


def stale(wheels: Sequence[Path], pins: dict[str, str]) -> list[Path]:
    """Wheels in the folder that are not one of the pinned versions (two versions break pip)."""
    wanted = {canonicalize_name(n): v for n, v in pins.items()}
    out = []
    for w in wheels:
        name, version, *_ = parse_wheel_filename(w.name)
        if wanted.get(canonicalize_name(name)) != str(version):
            out.append(w)
    return out


def exclude_folder(repo: Path, folder: str) -> None:
    """Add ``/<folder>/`` to the repository's ``.git/info/exclude`` once."""
    exclude = repo / ".git" / "info" / "exclude"
    if not exclude.parent.is_dir():
        return  # not a plain git checkout (a worktree or an exported tree): nothing to do
    line = f"/{folder}/"
    text = exclude.read_text(encoding="utf-8") if exclude.exists() else ""
    if line not in text.splitlines():
        exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n") + line + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dest", type=Path, default=ROOT / ".whl")
    p.add_argument("--max-mib", type=float, default=40.0)
    args = p.parse_args(argv)
    dest = args.dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    if dest.parent == ROOT:
        exclude_folder(ROOT, dest.name)
    pins = pinned_versions(NEEDED)
    for wheel in stale(sorted(dest.glob("*.whl")), pins):
        print(f"removing {wheel.name} (not a pinned version)")
        wheel.unlink()
    have = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in dest.glob("*.whl")}
    for name, version in pins.items():
        if canonicalize_name(name) not in have:
            download(name, version, dest)
    wheels = sorted(dest.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:7.2f} MiB  {w.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {dest}")
    if gaps := unmet(wheels):
        for name, missing in gaps.items():
            print(f"{name} requires {', '.join(missing)}: neither downloaded nor in the image")
        return 1
    if total > args.max_mib * 2**20:
        print(f"over --max-mib {args.max_mib:g}: the device's working tree holds 64 MiB in all")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
