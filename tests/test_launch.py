"""Launch buttons: every chapter's first code cell installs tutorial_lib where it is missing
(Colab), and binder/ builds an image that has it (Binder). See scripts/notebook_header.py."""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (requires-python allows it)
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book" / "chapters").glob("*.ipynb"))


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


header = _load(ROOT / "scripts" / "notebook_header.py")
CELL: str = header.INSTALL_CELL
PACKAGE_LINE = re.compile(r"^PACKAGE = .*$", re.MULTILINE)


def _package(cell: str) -> str:
    """The value the cell gives ``PACKAGE`` (its REPO and PACKAGE lines, run on their own)."""
    names: dict[str, str] = {}
    lines = [ln for ln in cell.splitlines() if ln.startswith(("REPO = ", "PACKAGE = "))]
    exec("\n".join(lines), {}, names)  # two string assignments from our own cell
    return names["PACKAGE"]


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


@pytest.fixture(scope="module")
def book_config() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "book" / "_config.yml").read_text())


# --- the cell -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_starts_with_the_install_cell(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    index = header.first_code_cell(nb)
    found = "" if index is None else nb.cells[index].source
    diff = difflib.unified_diff(CELL.splitlines(), found.splitlines(), "INSTALL_CELL", path.name)
    assert header.problem(nb) is None, (
        f"{path.name}: the first code cell must be scripts/notebook_header.py's INSTALL_CELL "
        "(run `python scripts/notebook_header.py apply book/chapters/*.ipynb`):\n"
        + "\n".join(line.rstrip("\n") for line in diff)
    )


def test_package_is_this_repository(project: dict[str, Any], book_config: dict[str, Any]) -> None:
    req = Requirement(_package(CELL))
    assert canonicalize_name(req.name) == canonicalize_name(project["name"])
    repo = book_config["repository"]
    assert req.url == f"git+{repo['url']}@{repo['branch']}"


def test_cell_is_ruff_clean() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed")
    # Under book/chapters, so that the notebooks' ruff settings apply; at any line length from
    # 79 up, `ruff format` leaves the cell as it is.
    for args in (["check"], ["format", "--check"], ["format", "--check", "--line-length", "79"]):
        done = subprocess.run(
            [ruff, *args, "--stdin-filename", "book/chapters/install_cell.py", "-"],
            input=CELL + "\n",
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_apply_inserts_then_updates(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 1. Title"), nbformat.v4.new_code_cell("x = 1")]
    assert header.problem(nb) and header.apply(nb)
    assert [c.source for c in nb.cells] == ["# 1. Title", CELL, "x = 1"]
    assert nb.cells[1].metadata == header.NEW_CELL_METADATA
    assert not header.apply(nb)  # already there
    nb.cells[1].source = header.MARKER + "\nold_version = True"
    nb.cells[1].metadata["tags"] = ["mine"]
    assert header.apply(nb) and len(nb.cells) == 3
    assert nb.cells[1].source == CELL and nb.cells[1].metadata["tags"] == ["mine"]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    assert header.main(["check", str(path)]) == 0
    nb.cells.pop(1)
    nbformat.write(nb, path)
    assert header.main(["check", str(path)]) == 1


def test_cell_does_nothing_where_the_package_is_installed(monkeypatch) -> None:
    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the cell ran {args}, but tutorial_lib is importable here")

    monkeypatch.setattr(subprocess, "check_call", no_pip)
    exec(compile(CELL, "install_cell", "exec"), {})


# --- the cell in a fresh environment, offline -----------------------------------------------

# The cell runs in DRIVER's process, as in a kernel; DRIVER then imports the package in that same
# process and reports where it came from and which commands the cell ran.
DRIVER = """
import json, subprocess, sys
calls, real = [], subprocess.check_call
def spy(cmd, *args, **kwargs):
    calls.append(cmd)
    return real(cmd, *args, **kwargs)
subprocess.check_call = spy
exec(compile(sys.argv[1], "install_cell", "exec"), {})
import tutorial_lib
print(json.dumps({"calls": calls, "file": tutorial_lib.__file__}))
"""


def _dependencies_without_the_package(dest: Path) -> Path:
    """A folder of links to everything in this interpreter's site-packages except tutorial_lib
    (and pip, which the new environment brings). On PYTHONPATH it makes the dependencies
    importable, and installed for pip, with no download; PYTHONPATH skips .pth files, and the
    editable install's finder is left out, so tutorial_lib itself stays invisible."""
    dest.mkdir()
    sites = [Path(p) for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    for site in [Path(sysconfig.get_paths()["purelib"]), *sites]:
        for entry in site.iterdir() if site.is_dir() else ():
            name = entry.name.lower()
            skip = name.startswith(("tutorial_lib", "__editable__", "pip-")) or name == "pip"
            if not skip and not name.endswith(".pth") and not (dest / entry.name).exists():
                (dest / entry.name).symlink_to(entry)
    return dest


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cell_installs_the_package_offline(tmp_path: Path) -> None:
    """The Colab path: no tutorial_lib, so the cell pip-installs it (here from a copy of this
    checkout instead of GitHub) and the same process imports it; a second run calls no pip."""
    src = tmp_path / "src"  # only the package's sources: an in-tree build writes next to them
    shutil.copytree(
        ROOT / "tutorial_lib", src / "tutorial_lib", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    cell = PACKAGE_LINE.sub(f'PACKAGE = "tutorial_lib @ {src.as_uri()}"', CELL)
    assert cell != CELL

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)  # ensurepip: offline
    python = venv / "bin" / "python"
    run_dir = tmp_path / "run"  # not the repository, whose tutorial_lib/ would be importable
    run_dir.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(_dependencies_without_the_package(tmp_path / "deps")),
        "PIP_CONFIG_FILE": os.devnull,  # ignore this machine's pip configuration
        "PIP_NO_INDEX": "1",  # nothing is downloaded; dependencies are found installed
        "PIP_NO_BUILD_ISOLATION": "0",  # i.e. --no-build-isolation: setuptools from PYTHONPATH
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "OMP_NUM_THREADS": "1",
    }

    def run() -> dict[str, Any]:
        done = subprocess.run(
            [str(python), "-c", DRIVER, cell],
            cwd=run_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    assert len(first["calls"]) == 1 and first["calls"][0][1:4] == ["-m", "pip", "install"]
    assert Path(first["file"]).resolve().is_relative_to(venv.resolve()), first["file"]
    second = run()
    assert second["calls"] == [], "the cell called pip although tutorial_lib was installed"
    assert second["file"] == first["file"]


# --- Binder ---------------------------------------------------------------------------------

BINDER = ROOT / "binder"


def _binder_requirements() -> list[str]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def test_binder_python_matches_the_other_environments(project: dict[str, Any]) -> None:
    runtime = (BINDER / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)", runtime)
    assert match, f"binder/runtime.txt must read python-X.Y, not {runtime!r}"
    assert SpecifierSet(project["requires-python"]).contains(f"{match.group(1)}.0")
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    assert f"python={match.group(1)}" in conda  # the same Python as the conda environment
    # With an environment.yml there, repo2docker would use conda and ignore both files.
    assert not (BINDER / "environment.yml").exists()


def test_binder_installs_cpu_torch_and_the_package(project: dict[str, Any]) -> None:
    lines = _binder_requirements()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    editable = [line for line in lines if line.startswith("-e")]
    assert len(editable) == 1, "install the package itself with `-e .[extras]`"
    match = re.fullmatch(r"-e\s+\.\[([^\]]*)\]", editable[0])
    assert match and "book" in {e.strip() for e in match.group(1).split(",")}, editable[0]
    # Only torch is pinned here; every other dependency comes from pyproject.toml.
    reqs = [Requirement(line) for line in lines if not line.startswith("-")]
    assert [canonicalize_name(r.name) for r in reqs] == ["torch"]
    (pin,) = reqs[0].specifier
    assert pin.operator == "==" and pin.version.endswith("+cpu"), f"torch must be pinned: {pin}"
    makefile = (ROOT / "Makefile").read_text()
    make_pin = re.search(r"^TORCH_CPU_SPEC\s*\?=\s*torch==(\S+)", makefile, re.MULTILINE)
    assert make_pin, "no TORCH_CPU_SPEC in the Makefile"
    assert pin.version == f"{make_pin.group(1)}+cpu", "Binder's torch differs from make's"
    declared = {canonicalize_name(Requirement(d).name): d for d in project["dependencies"]}
    assert Requirement(declared["torch"]).specifier.contains(pin.version)
