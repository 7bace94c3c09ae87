"""The GitHub Actions workflow that publishes the book (.github/workflows/pages.yml), checked
against the Makefile and book/_config.yml: no runner needed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
PAGES = ROOT / ".github" / "workflows" / "pages.yml"
# owner/repo@vN (a major-version tag) or @<40-hex commit>; never a branch such as @main
PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@(v\d+|[0-9a-f]{40})$")


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path.name} is not a YAML mapping"
    if True in data:  # YAML 1.1 reads the key `on` as the boolean true
        data["on"] = data.pop(True)
    return data


def steps_using(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if s.get("uses", "").split("@")[0] == action]


def major(uses: str) -> int:
    match = re.fullmatch(r".*@v(\d+)", uses)
    assert match, f"{uses}: pin a major version tag (@vN) to compare versions"
    return int(match.group(1))


@pytest.fixture(scope="module")
def pages() -> dict[str, Any]:
    return load(PAGES)


@pytest.fixture(scope="module")
def makefile() -> str:
    return (ROOT / "Makefile").read_text()


def make_var(makefile: str, name: str) -> str:
    match = re.search(rf"^{name}\s*[:?]?=\s*(\S+)", makefile, re.MULTILINE)
    assert match, f"no {name} in the Makefile"
    return match.group(1)


def recipe(makefile: str, target: str) -> str:
    match = re.search(rf"^{target}:.*\n((?:\t.*\n?)*)", makefile, re.MULTILINE)
    assert match, f"no `{target}` target in the Makefile"
    return match.group(1)


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned(path: Path) -> None:
    for job_id, job in load(path)["jobs"].items():
        for step in job["steps"]:
            if "uses" in step:
                assert PINNED.match(step["uses"]), f"{path.name}/{job_id}: {step['uses']}"


def test_triggers(pages: dict[str, Any]) -> None:
    config = yaml.safe_load((ROOT / "book" / "_config.yml").read_text())
    assert pages["on"]["push"]["branches"] == [config["repository"]["branch"]]
    assert "workflow_dispatch" in pages["on"]
    assert "pull_request" not in pages["on"], "a pull request must not publish the book"


def test_only_the_deploy_job_may_publish(pages: dict[str, Any]) -> None:
    assert pages["permissions"] == {"contents": "read"}
    deploy = pages["jobs"]["deploy"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    for job_id, job in pages["jobs"].items():
        if job_id != "deploy":
            assert "permissions" not in job, f"{job_id} gets the workflow's read-only token"
    assert pages["concurrency"] == {"group": "pages", "cancel-in-progress": False}


def test_build_job_runs_make_book_at_the_ci_preset(pages: dict[str, Any], makefile: str) -> None:
    build = pages["jobs"]["build"]
    assert build["runs-on"] == "ubuntu-latest"
    runs = [s["run"].strip() for s in build["steps"] if "run" in s]
    assert runs == ["make book"], "the book is built by `make book`, which sets itself up"
    assert build["env"]["TORCH"] == "cpu"
    assert build["env"]["TUTORIAL_PRESET"] == make_var(makefile, "PRESET_CI") == "ci"
    assert steps_using(build, "actions/checkout")
    (python,) = steps_using(build, "actions/setup-python")
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    assert f"python={python['with']['python-version']}" in conda, "same Python as conda's"


def test_uploads_the_folder_make_builds(pages: dict[str, Any], makefile: str) -> None:
    html = f"{make_var(makefile, 'BUILD')}/html"  # book/_build/html
    build_html = recipe(makefile, "html")
    assert "$(BUILD)/html" in build_html
    # jupyter-book writes to <path-output>/_build/html
    path_output = re.search(r"jupyter-book build .*--path-output (\S+)", build_html)
    assert path_output and f"{path_output.group(1)}/_build/html" == html
    (upload,) = steps_using(pages["jobs"]["build"], "actions/upload-pages-artifact")
    assert upload["with"]["path"] == html


def test_deploy_job(pages: dict[str, Any]) -> None:
    build, deploy = pages["jobs"]["build"], pages["jobs"]["deploy"]
    assert deploy["needs"] in ("build", ["build"])
    assert deploy["environment"]["name"] == "github-pages"
    (step,) = steps_using(deploy, "actions/deploy-pages")
    assert deploy["environment"]["url"] == f"${{{{ steps.{step['id']}.outputs.page_url }}}}"
    # deploy-pages v4 and later deploy only artifacts from upload-pages-artifact v3 and later
    (upload,) = steps_using(build, "actions/upload-pages-artifact")
    if major(step["uses"]) >= 4:
        assert major(upload["uses"]) >= 3
