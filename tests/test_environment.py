"""environment.yml (conda, for GPU users) and pyproject.toml must agree on the runtime stack."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (requires-python allows it)
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]

# conda names that differ from the PyPI name of the same package
CONDA_TO_PYPI = {"pytorch": "torch"}
# conda-only entries: the interpreter, pip itself, and the CUDA build selector of pytorch
CONDA_ONLY = {"python", "pip", "pytorch-cuda"}

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def _split(requirement: str) -> tuple[str, str]:
    """'numpy>=1.26' -> ('numpy', '>=1.26'); names normalised as in PEP 503."""
    match = _REQ.match(requirement)
    assert match, requirement
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    return name, match.group(3).replace(" ", "")


@pytest.fixture(scope="module")
def env() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _conda_and_pip(env: dict[str, Any]) -> tuple[list[str], list[str]]:
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pips = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pips) <= 1
    return conda, pips[0] if pips else []


def _env_runtime(env: dict[str, Any]) -> dict[str, str]:
    conda, pip = _conda_and_pip(env)
    found: dict[str, str] = {}
    for dep in conda:
        name, spec = _split(dep)
        if name not in CONDA_ONLY:
            # conda's single '=' pins a version prefix; pip would write '==' (none here).
            found[CONDA_TO_PYPI.get(name, name)] = spec
    for dep in pip:
        if not dep.startswith("-"):
            name, spec = _split(dep)
            found[name] = spec
    return found


def test_environment_parses(env: dict[str, Any]) -> None:
    assert env["name"]
    assert "conda-forge" in env["channels"]
    conda, pip = _conda_and_pip(env)
    assert "pip" in conda and pip


def test_runtime_dependencies_match_pyproject(env: dict[str, Any], project: dict[str, Any]) -> None:
    declared = dict(_split(d) for d in project["dependencies"])
    assert _env_runtime(env) == declared  # same names and the same lower bounds


def test_pip_installs_the_package_with_extras(env: dict[str, Any]) -> None:
    _, pip = _conda_and_pip(env)
    editable = [d for d in pip if d.startswith("-e")]
    assert len(editable) == 1
    match = re.fullmatch(r"-e\s+\.(?:\[([^\]]*)\])?", editable[0].strip())
    assert match, editable[0]
    extras = {e.strip() for e in (match.group(1) or "").split(",")}
    assert {"book", "te"} <= extras


def test_python_is_pinned_and_allowed(env: dict[str, Any], project: dict[str, Any]) -> None:
    conda, _ = _conda_and_pip(env)
    pins = [d for d in conda if _split(d)[0] == "python"]
    assert len(pins) == 1
    match = re.fullmatch(r"python\s*=?=\s*(\d+)\.(\d+)(?:\.\d+)?", pins[0])
    assert match, f"python should be pinned to a version, got {pins[0]!r}"
    pinned = (int(match.group(1)), int(match.group(2)))
    lower = re.fullmatch(r">=\s*(\d+)\.(\d+)", project["requires-python"])
    assert lower, project["requires-python"]
    assert pinned >= (int(lower.group(1)), int(lower.group(2)))


def test_pyproject_extras(project: dict[str, Any]) -> None:
    extras = project["optional-dependencies"]
    assert {"book", "dev", "te"} <= set(extras)
    assert any(_split(d)[0] == "transformer-engine" for d in extras["te"])
    dev = {_split(d)[0] for d in extras["dev"]}
    assert {"pytest", "pytest-xdist", "ruff", "hypothesis"} <= dev
    assert any(_split(d)[0] == "jupyter-book" for d in extras["book"])
