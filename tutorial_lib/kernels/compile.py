"""``torch.compile``'s output in view: graph breaks, generated code and kernel counts.

``torch.compile`` traces Python into FX graphs (TorchDynamo), differentiates them ahead of time
(AOTAutograd) and hands them to Inductor, which fuses pointwise and reduction ops into generated
kernels: Triton on a GPU, C++/OpenMP on the CPU. Matmuls and attention stay library calls
(``extern_kernels.mm``, ``addmm``, SDPA). This module reports what that produced (the time
compilation costs is the ``Trainer``'s ``compile_time_s``):

- ``count_graph_breaks``: the graphs and graph breaks of whatever compiles inside a ``with``
  block (a whole training run), with short reasons and the lines of code where Dynamo broke;
- ``generated_code`` / ``count_kernels``: the code Inductor wrote, and how many kernels it launches;
- ``count_eager_ops``: how many ATen operators eager PyTorch dispatches for the same work, each one
  a kernel that reads its inputs from and writes its output to memory.

``count_graph_breaks`` reads Dynamo's own records: its counters (``torch._dynamo.utils.counters``)
and the ``GraphCompileReason`` it keeps for every graph break (a reason and the user's stack, the
records ``torch._dynamo.explain`` reports). Both are private torch APIs, stable in practice
since torch 2.1; if they are missing, the counts stay ``None`` instead of raising.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..autocast_inspect import record_op_dtypes

__all__ = [
    "GraphBreaks",
    "count_graph_breaks",
    "short_break_reason",
    "generated_code",
    "count_kernels",
    "kernel_names",
    "kernel_excerpt",
    "count_eager_ops",
]


@dataclass
class GraphBreaks:
    """What Dynamo compiled while a ``count_graph_breaks()`` block ran.

    graphs: FX graphs captured.
    breaks: graph breaks. Dynamo counts one each time it stops tracing while it *compiles* a
        frame, not each time the compiled code hands back to Python at run time: identical
        layers share one compiled frame, so a break inside a block counts once, not per layer.
    reasons: ``short_break_reason`` -> count, for those breaks.
    skipped_frames: frames Dynamo gave up on and ran eagerly (e.g. a graph break inside a loop);
        ``skip_reasons`` says why.
    sites: ``"file.py:line  source"`` -> count, the line of user code where each break happened.
    """

    graphs: int | None = None
    breaks: int | None = None
    reasons: dict[str, int] = field(default_factory=dict)
    skipped_frames: int | None = None
    skip_reasons: dict[str, int] = field(default_factory=dict)
    sites: dict[str, int] = field(default_factory=dict)


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
_NESTED = "*** While handling this graph break, another graph break occurred: ***"


def short_break_reason(text: str) -> str:
    """Dynamo's multi-line reason as one line: the heading and the explanation of each break
    (nested ones joined by ``" -> "``), without memory addresses, so that runs compare."""
    parts = []
    for part in text.split(_NESTED):
        lines = [line.strip() for line in part.strip().splitlines() if line.strip()]
        if not lines:
            continue
        why = next((ln for ln in lines if ln.startswith("Explanation:")), "")
        why = why.removeprefix("Explanation:").strip()
        parts.append(f"{lines[0]}: {why}" if why else lines[0])
    return _ADDRESS.sub("", " -> ".join(parts))


def _short_counts(texts: Counter[str]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for text, n in texts.items():
        out[short_break_reason(text)] += n
    return dict(out.most_common())


@contextlib.contextmanager
def count_graph_breaks() -> Iterator[GraphBreaks]:
    """Count what Dynamo compiles inside the block; the yielded ``GraphBreaks`` is filled in
    when the block exits. Reads the difference of torch's counters and the graph-break records
    Dynamo adds meanwhile (nothing is cleared). Code that is already compiled, with guards that
    still hold, compiles nothing and counts nothing: call ``torch._dynamo.reset()`` first to
    count a model's breaks from scratch."""
    result = GraphBreaks()
    try:
        from torch._dynamo.utils import counters, graph_break_reasons
    except ImportError:  # pragma: no cover - a torch that renamed them
        yield result
        return
    keys = ("stats", "frames", "unimplemented")
    before = {k: Counter(counters[k]) for k in keys}
    first_new = len(graph_break_reasons)
    try:
        yield result
    finally:
        delta = {k: counters[k] - before[k] for k in keys}
        new = graph_break_reasons[first_new:]
        result.graphs = delta["stats"]["unique_graphs"]
        result.breaks = len(new)
        result.reasons = _short_counts(Counter(r.reason for r in new))
        result.skipped_frames = delta["frames"]["total"] - delta["frames"]["ok"]
        # An error Dynamo could not turn into a graph break stays in "unimplemented"; a nested
        # one ("A -> graph break in loop") is counted again on its own ("A"): keep the longer form.
        skips = _short_counts(delta["unimplemented"])
        result.skip_reasons = {
            r: n for r, n in skips.items() if not any(o.startswith(r + " -> ") for o in skips)
        }
        sites = Counter(
            f"{Path(f.filename).name}:{f.lineno}  {(f.line or '').strip()}".rstrip()
            for f in (r.user_stack[-1] for r in new if r.user_stack)
        )
        result.sites = dict(sites.most_common())


def generated_code(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[str]:
    """The source Inductor generated while running ``fn(*args)`` (``fn`` should call a
    ``torch.compile``d function). One string per compiled graph (forward and backward apart)."""
    from torch._inductor.utils import run_and_get_code

    _, code = run_and_get_code(fn, *args, **kwargs)
    return list(code)


# Inductor defines each generated kernel once (``cpp_fused_gelu_0 = async_compile.cpp_pybinding(
# ...)``, ``triton_poi_fused_gelu_0 = async_compile.triton(...)``) and launches it from the graph's
# ``call`` function, once per use (``cpp_fused_gelu_0(buf0, buf1)``,
# ``triton_poi_fused_gelu_0.run(...)``); library kernels are calls to ``extern_kernels.mm(...)``
# or ``torch.ops.aten.<op>(...)``. Only statements that *start* with a call count, so op names
# quoted in ``assert_size_stride(..., 'torch.ops.aten.mm.default')`` do not.
_KERNEL_DEF = re.compile(r"^\s*(triton_\w+|cpp_fused_\w+)\s*=\s*async_compile\.", re.M)
_KERNEL_LAUNCH = re.compile(r"^\s*(triton_\w+|cpp_fused_\w+)(?:\.run)?\(", re.M)
_LIBRARY_CALL = re.compile(
    r"^\s*(?:[\w, ]+=\s*)?(?:extern_kernels\.\w+|torch\.ops\.aten\.[\w.]+)\(", re.M
)


def count_kernels(code: str | list[str]) -> dict[str, int]:
    """Kernels in Inductor's generated code: ``generated`` (distinct fused kernels it wrote),
    ``launches`` (how often they are launched: a kernel shared by identical layers counts once
    per layer) and ``library`` (calls to library kernels: matmuls, attention, ...).

    ``launches + library`` is comparable to ``count_eager_ops``' total for the same work."""
    text = code if isinstance(code, str) else "\n".join(code)
    generated = {m.group(1) for m in _KERNEL_DEF.finditer(text)}
    launches = sum(1 for m in _KERNEL_LAUNCH.finditer(text) if m.group(1) in generated)
    library = sum(1 for _ in _LIBRARY_CALL.finditer(text))
    return {"generated": len(generated), "launches": launches, "library": library}


def kernel_names(code: str) -> list[str]:
    """The generated kernels defined in one graph's code, in order of definition."""
    return [m.group(1) for m in _KERNEL_DEF.finditer(code)]


def kernel_excerpt(code: str, name_contains: str = "gelu", max_lines: int = 32) -> str:
    """A readable slice of one graph's generated code: the body of the first generated kernel
    whose name contains ``name_contains`` (else the first kernel), up to ``max_lines`` lines,
    then every kernel launch and library call of the graph's ``call`` function."""
    lines = code.splitlines()
    defs = [i for i, line in enumerate(lines) if _KERNEL_DEF.match(line)]
    if not defs:
        raise ValueError("No generated kernel in this code (was it produced by Inductor?).")
    start = next((i for i in defs if name_contains in lines[i]), defs[0]) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("'''")), len(lines))
    body = [line for line in lines[start:end] if line.strip()]
    first = next((i for i, line in enumerate(body) if line.startswith(("def ", 'extern "C"'))), 0)
    calls = [
        line.strip() for line in lines if _KERNEL_LAUNCH.match(line) or _LIBRARY_CALL.match(line)
    ]
    return "\n".join(body[first : first + max_lines] + ["...", "", "# launches in call():"] + calls)


def count_eager_ops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Counter[str]:
    """ATen operators (views and detaches excluded) that eager ``fn(*args)`` dispatches, by name.

    Each is one kernel launch (on the CPU, one pass of a library routine) that reads its inputs
    and writes its output: the round trips fusion removes. Includes backward ops if ``fn`` calls
    ``backward()``; zero the gradients first (``set_to_none``), or the count includes the
    ``aten.add_`` calls that accumulate into existing ``.grad`` tensors.
    """
    return Counter(record.op for record in record_op_dtypes(lambda: fn(*args, **kwargs)))
