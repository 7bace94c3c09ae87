"""The package's layering: no import cycles, and the measuring tools sit below the trainer.

Reads every module of ``tutorial_lib`` with ``ast`` and builds the graph of its imports between
the package's own modules, top-level, deferred (inside functions) and ``TYPE_CHECKING`` alike: a
deferred or typing-only import hides a cycle from Python's import machinery, not from the design.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tutorial_lib"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """module -> the tutorial_lib modules it imports (a package import counts as its __init__)."""
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            found: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level == 0 and node.module and node.module.startswith("tutorial_lib"):
                    base = node.module
                elif node.level > 0:
                    base = _resolve(name, is_package, node.level, node.module)
                else:
                    continue
                for a in node.names:  # "from . import kernels" imports a module, else a name
                    sub = f"{base}.{a.name}"
                    found.append(sub if sub in modules else base)
            elif isinstance(node, ast.Import):
                found += [a.name for a in node.names if a.name.startswith("tutorial_lib")]
            for target in found:
                while target and target not in modules:  # a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def test_only_the_package_facade_imports_the_package_root() -> None:
    """``tutorial_lib/__init__`` re-exports everything, so a module importing the root would
    import everything above it too."""
    graph = import_graph()
    importers = [m for m, targets in graph.items() if "tutorial_lib" in targets]
    assert sorted(importers) in ([], ["tutorial_lib.__main__", "tutorial_lib.cli"])  # __version__


def _layer(module: str) -> str:
    """The unit of layering: a subpackage, or a top-level module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_deferred_imports() -> None:
    graph = import_graph()
    assert "tutorial_lib.model" in graph["tutorial_lib.layers"]  # deferred, inside a method
    assert "tutorial_lib.perf" in graph["tutorial_lib.train"]


def test_the_graph_sees_typing_only_imports() -> None:
    graph = import_graph()  # layers.py imports config in a TYPE_CHECKING block only
    assert "tutorial_lib.config" in graph["tutorial_lib.layers"]


# Module cycles still to break (issue 33): each is a pair or a group of modules that should be
# one module, or one of which should not know the other. A new cycle fails this test, and so
# does breaking one of these without taking it off the list.
KNOWN_MODULE_CYCLES = [
    ["tutorial_lib.layers", "tutorial_lib.model"],
]


def test_module_cycles_are_only_the_known_ones() -> None:
    assert sorted(_cycles(import_graph())) == sorted(KNOWN_MODULE_CYCLES)


def test_parallel_imports_neither_build_nor_train() -> None:
    """``parallel/`` holds transforms over modules and collectives; the pipeline (``build``) and
    the loop (``train``) use them, never the other way round."""
    graph = import_graph()
    for module, targets in graph.items():
        if module.startswith("tutorial_lib.parallel"):
            assert not targets & {"tutorial_lib.build", "tutorial_lib.train"}, module


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_cycles_between_subpackages_and_modules() -> None:
    graph = import_graph()
    layers: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module == "tutorial_lib":
            continue  # the facade: it imports every layer and nothing imports it
        src = _layer(module)
        layers.setdefault(src, set()).update(_layer(t) for t in targets if _layer(t) != src)
    # layers.py <-> model.py is the one allowed pair: the factory builds the model's own MLP and
    # Block (a deferred import), and the model asks the factory for them.
    allowed = {"tutorial_lib.layers": {"tutorial_lib.model"}}
    for src, targets in allowed.items():
        layers[src] -= targets
    assert _cycles(layers) == []


@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("tutorial_lib.perf", "tutorial_lib.train"),
        ("tutorial_lib.perf", "tutorial_lib.bench"),
        ("tutorial_lib.model", "tutorial_lib.train"),
        ("tutorial_lib.cluster", "tutorial_lib.parallel"),
        ("tutorial_lib.cluster", "tutorial_lib.train"),
    ],
)
def test_lower_layers_never_import_higher_ones(low: str, high: str) -> None:
    graph = import_graph()
    reach: set[str] = set()
    todo = [m for m in graph if m == low or m.startswith(low + ".")]
    while todo:
        m = todo.pop()
        for t in graph[m]:
            if t not in reach:
                reach.add(t)
                todo.append(t)
    assert not any(t == high or t.startswith(high + ".") for t in reach), (low, high)
