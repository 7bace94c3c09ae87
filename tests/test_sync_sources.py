"""The package code the chapters show is copied from the package (scripts/sync_sources.py), so it
reads the same in the book, in Jupyter and on the code-hosting site, and cannot drift."""

from __future__ import annotations

import copy
import importlib.util
import inspect
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book" / "chapters").glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("sync_sources", ROOT / "scripts" / "sync_sources.py")
assert _spec and _spec.loader
ss = importlib.util.module_from_spec(_spec)
sys.modules["sync_sources"] = ss
_spec.loader.exec_module(ss)

# Each chapter's core logic, which the chapter must show (issue #16): module:qualname prefixes.
CORE = {
    "01": ["tutorial_lib.model:GPT.forward", "tutorial_lib.layers:TorchLayers"],
    "02": ["tutorial_lib.perf:benchmark"],
    "03": ["tutorial_lib.precision:PrecisionPolicy"],
    "04": ["tutorial_lib.fp8.formats:quantize"],
    "05": [
        "tutorial_lib.fp8.scaling:update_amax_and_scale",
        "tutorial_lib.fp8.linear_function:FP8LinearFunction",
    ],
    "06": ["tutorial_lib.fp8.linear_function:RecipeOperands", "tutorial_lib.fp8.recipes:NVFP4"],
    "07": ["tutorial_lib.kernels.bias_gelu:bias_gelu_fwd_kernel"],
    "08": ["tutorial_lib.bench.ladder:ladder_rungs"],
    "09": ["tutorial_lib.parallel.mesh:local_rows", "tutorial_lib.parallel.dp:shard_with_fsdp"],
    "10": [
        "tutorial_lib.parallel.tp_linear:ColumnParallelLinear",
        "tutorial_lib.parallel.tp_linear:RowParallel",
    ],
    "11": ["tutorial_lib.cluster.plans:plan_cluster"],
}


def _shown(nb: nbformat.NotebookNode) -> list[str]:
    return [spec for cell in nb.cells for spec in cell.metadata.get(ss.KEY, [])]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_each_chapter_shows_its_core_code_and_it_is_current(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    shown = _shown(nb)
    for want in CORE[path.name[:2]]:
        assert any(s.startswith(want) for s in shown), f"{path.name} does not show {want}"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for output_only in ("getsource", "getdoc", "__doc__"):  # an output shows in two views only
        assert output_only not in code, "show package code and text with a source cell"
    before = copy.deepcopy(nb)
    assert ss.sync(nb) == [], f"{path.name} shows old code: run `make sync`"
    assert nb == before
    private = [s for s in shown if any(_is_private(p) for p in s.partition(":")[2].split("."))]
    assert private == [], f"{path.name} shows private names; the book reads what is public"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_render_copies_the_object_with_a_link_to_its_lines() -> None:
    from tutorial_lib.fp8 import quantize

    text = ss.render(["tutorial_lib.fp8.formats:quantize"], base="https://example.org/blob/main")
    lines, start = inspect.getsourcelines(quantize)
    end = start + len(lines) - 1
    url = f"https://example.org/blob/main/tutorial_lib/fp8/formats.py#L{start}-L{end}"
    assert f"[`tutorial_lib/fp8/formats.py`]({url})" in text
    assert f"```python\n{textwrap.dedent(''.join(lines)).rstrip()}\n```" in text


def test_methods_are_dedented_and_docstrings_can_be_left_out() -> None:
    text = ss.render(["tutorial_lib.model:GPT.forward"], {"docstring": False}, base="u")
    code = text.split("```python\n", 1)[1]
    assert code.startswith("def forward(")
    assert '"""' not in code and "return logits, loss" in code


def test_a_triton_kernel_shows_its_python_function() -> None:
    text = ss.render(["tutorial_lib.kernels.bias_gelu:gelu_tanh"], base="u")
    assert "@triton.jit\ndef gelu_tanh(" in text


def test_sync_rewrites_a_stale_cell_and_check_mode_reports_it(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_markdown_cell("old copy", metadata={ss.KEY: ["tutorial_lib.perf:mfu"]})
    nb.cells = [nbformat.v4.new_markdown_cell("# Title"), cell]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    assert ss.main(["--check", str(path)]) == 1
    assert nbformat.read(path, as_version=4).cells[1].source == "old copy"  # nothing written
    assert ss.main([str(path)]) == 0
    assert "def mfu(" in nbformat.read(path, as_version=4).cells[1].source
    assert ss.main(["--check", str(path)]) == 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tutorial_lib.model.GPT", "write module:qualname"),
        ("tutorial_lib.model:NoSuchThing", "tutorial_lib.model has no NoSuchThing"),
    ],
)
def test_bad_names_get_a_clear_error(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ss.resolve(spec)


def test_source_metadata_on_a_code_cell_is_refused() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={ss.KEY: ["tutorial_lib.perf:mfu"]})]
    with pytest.raises(ValueError, match="belongs on a markdown cell"):
        ss.sync(nb)


def test_a_module_docstring_shows_as_text_cut_to_a_section() -> None:
    text = ss.render(
        ["tutorial_lib.cluster.plans:__doc__"],
        {"from": "Modelling assumptions", "until": "``cluster.packing``"},
        base="u",
    )
    body = text.split("```text\n", 1)[1]
    assert body.startswith("Modelling assumptions") and "cluster.packing" not in body
    assert "u/tutorial_lib/cluster/plans.py#L1-L" in text
    with pytest.raises(ValueError, match="no docstring line starts with 'Nowhere'"):
        ss.render(["tutorial_lib.cluster.plans:__doc__"], {"from": "Nowhere"}, base="u")
